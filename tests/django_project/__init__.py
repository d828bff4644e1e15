"""A small real Django project for leaseq.contrib.django's tests (settings, a shop app
with models, tasks and views). The database comes from LEASEQ_DJANGO_TEST_DSN."""
