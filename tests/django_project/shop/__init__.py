"""The test project's app: orders, and the receipt task enqueued with them."""
