"""Kill a 2-process FSDP2 run with kill -9 at random moments (odd trials inside a checkpoint write), re-run
it with the same command until it finishes, and check each rank's losses and sample ids against an uninterrupted run.
With --elastic: a job of 2 nodes x 2 processes (torchrun's elastic agent, each node in a namespace of its own) loses
node 1 to kill -9 and goes on without a re-submission; each trial's samples against an uninterrupted run's, its losses
after the checkpoint against a run resumed by hand, and its recovery timed (llmfoundry_ext/measure/elastic_chaos.py).

  python scripts/chaos.py --trials 20 [--seed 0] [--folder chaos_run] [--json chaos.json]
  python scripts/chaos.py --elastic --trials 6 [--json elastic.json]
  python scripts/chaos.py --elastic-edges [--json edges.json]   # a node joining; the ends, each re-submitted
"""
import argparse
import sys

from llmfoundry_ext.measure.chaos import trials_command


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--trials', type=int, default=20)
    parser.add_argument('--seed', type=int, default=0, help='chooses the kill points')
    parser.add_argument('--write-delay', type=float, default=0.02,
                        help='seconds slept after each item a checkpoint writes, so that a kill can land inside')
    parser.add_argument('--folder', help='keep the runs here (default: a temporary folder)')
    parser.add_argument('--json', help='write the table here')
    parser.add_argument('--elastic', action='store_true', help='a 2-node elastic job that loses a node, each trial')
    parser.add_argument('--elastic-edges', action='store_true',
                        help='a node joining an elastic job, and the ways one ends (measure/elastic_edges.py)')
    parser.add_argument('--node-timeout', type=float, default=30.0,
                        help='--elastic, --elastic-edges: the jobs\' node_timeout_s')
    args = parser.parse_args(argv)
    if args.elastic_edges:
        from llmfoundry_ext.measure.elastic_edges import edges_command
        return edges_command(args)
    if args.elastic:
        from llmfoundry_ext.measure.elastic_chaos import trials_command as elastic_trials
        return elastic_trials(args)
    return trials_command(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
