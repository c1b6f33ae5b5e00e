"""Train a Llama model as a YAML file says: ``composer train.py yamls/<run>.yaml [key=value ...]``."""
import sys

from llmfoundry_ext.train import main

if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
