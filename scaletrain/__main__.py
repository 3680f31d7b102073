import sys

try:
    from scaletrain.cli.main import main
except KeyboardInterrupt:   # Ctrl-C (or a launcher stopping its workers) while Python imports: no traceback
    sys.exit(130)

sys.exit(main())
