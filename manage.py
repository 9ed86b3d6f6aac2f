#!/usr/bin/env python
import os
import sys

if __name__ == "__main__":
    from provisioning.capacity import htools

    # hspace/hbal/hsqueeze on a Ganeti file or a simulation need no database: answered
    # without setting Django up (its start-up costs more than Ganeti's whole run).
    if htools.runs_without_django(sys.argv[1:]):
        status = htools.main(sys.argv[1:], prog=os.path.basename(sys.argv[0]), from_manage=True)
        if status is not None:
            sys.exit(status)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "vclmgr.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
