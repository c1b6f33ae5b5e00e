"""Composer's launcher, the ``composer`` command's own ``main``, started after this package is imported so that its
imports skip what no process of ours uses (``startup``): ``python -m llmfoundry_ext.launch -n 2 train.py run.yaml``
is ``composer -n 2 train.py run.yaml`` with ~4.5 s less start-up before the ranks start (8.8 -> 4.2 s on a 2-core
machine). The benchmarks, the chaos trials and the tests launch through it."""
import sys

from composer.cli.launcher import main

LAUNCHER = [sys.executable, '-m', 'llmfoundry_ext.launch']  # a command line's first words

if __name__ == '__main__':
    sys.exit(main())
