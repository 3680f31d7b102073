import os
import sys

try:
    from scaletrain.cli.main import main
    from scaletrain.distributed.env import die_with_launcher, under_launcher
    from scaletrain.errors import INTERRUPTED_EXIT_CODE, TERMINATED_EXIT_CODE
    from scaletrain.lifecycle.stops import end_daemonic_children
except KeyboardInterrupt:   # Ctrl-C (or a launcher stopping its workers) while Python imports: no traceback
    sys.exit(130)


def _run() -> int:
    try:
        return main()
    except KeyboardInterrupt:   # in the instant before main() installs its own handlers
        return 130


if not under_launcher():
    sys.exit(_run())

# A worker of a launched job. A fatal signal shows every thread's Python stack (a C++ abort would
# otherwise say only "terminate called without an active exception").
import faulthandler  # noqa: E402

faulthandler.enable()
die_with_launcher()
code = _run()
# The command has finished and torn its process group down. Gloo's C++ threads can still hold
# tensors at interpreter teardown, and destroying them then aborted a rank that had already done
# its work (seen once in CI, exit -6 after `predict` under fsdp). Nothing is left to run: flush
# and leave without the teardown. A stopped worker ends the daemonic children the teardown would
# have ended (a loader's workers, hung in a user's read, would sleep on as orphans). A failed one
# leaves them to their own watchdog, as before: they hold its copies of the group's sockets for
# the moments until its launcher stops the peers, which would otherwise fail first on a closed
# connection and print a traceback over the failure's one line (test_user_errors, two processes).
# (A bug's traceback, raised above, takes the ordinary exit.)
import logging  # noqa: E402

if code in (INTERRUPTED_EXIT_CODE, TERMINATED_EXIT_CODE):
    end_daemonic_children()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code if isinstance(code, int) else 1)
