#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    import gc

    # The imports below and a command's run free what they build by reference counting:
    # the cycle collector's passes would only cost time (Django's path turns it back on).
    gc.disable()
    from capacity import htools

    # hspace/hbal/hsqueeze on a Ganeti file or a simulation need no database: answered
    # without setting Django up (its start-up costs more than Ganeti's whole run).
    if htools.runs_without_django(sys.argv[1:]):
        status = htools.main(sys.argv[1:], prog=os.path.basename(sys.argv[0]), from_manage=True)
        if status is not None:
            htools.exit_now(status)
    gc.enable()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
