"""Write docs/config.md, every YAML key with its type, default and meaning, from the config classes
(llmfoundry_ext/config_reference.py). Run it after changing a config field or the comment beside it:

  python scripts/config_reference.py
"""
import argparse
import os
import sys

from llmfoundry_ext.config_reference import missing_lines, reference

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'docs', 'config.md')


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--out', default=os.path.normpath(DOCS))
    args = parser.parse_args(argv)
    if missing := missing_lines():
        print(f"no comment beside the field of {', '.join(missing)}: write one there", file=sys.stderr)
        return 1
    with open(args.out, 'w') as file:
        file.write(reference())
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
