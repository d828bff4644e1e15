"""The interpreter of one page's python snippets (run by the page's own environment's
python, so it imports nothing of the checkout): snippets arrive on stdin as JSON lines and
run in one namespace, in order, top-level ``await`` allowed; after each, one line
``ok`` on stdout (what snippets print goes to stderr); the first error prints its
traceback and exits 1."""

import ast
import asyncio
import json
import os
import sys
import traceback

# The protocol owns the original stdout; what the snippets print (and whatever writes to
# file descriptor 1) goes to stderr.
protocol = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
namespace = {"__name__": "__main__"}
loop = asyncio.new_event_loop()
for line in sys.stdin:
    snippet = json.loads(line)
    try:
        code = compile(
            snippet["code"], snippet["where"], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        )
        result = eval(code, namespace)
        if asyncio.iscoroutine(result):
            loop.run_until_complete(result)
    except BaseException:
        traceback.print_exc()
        sys.exit(1)
    protocol.write("ok\n")
    protocol.flush()
