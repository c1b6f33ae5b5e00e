"""Prepare the demo corpus and train on it with a stop and an autoresume: ``make demo``."""
import sys

from llmfoundry_ext.demo import main

if __name__ == '__main__':
    sys.exit(main())
