"""The `loopwright` command line: a command parses, calls the runtime, prints.

`root` assembles the commands and turns their failures into one line and an exit code
(`errors`); a module per command group declares its commands (`runs_commands`,
`approvals_command`, `serve_command`, `worker_command`, `tokens_command`, `faults_command`,
`graph_command`) and imports the runtime in each command's body only (`hosting`, `ending`):
help, and a usage error, need none of it.
"""

from loopwright.cli.root import app, main

__all__ = ["app", "main"]
