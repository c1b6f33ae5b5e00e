"""The learning benchmark: ours beside torchtitan and transformers' Llama on the same tokens of a real text.

  python scripts/measure_learning.py --steps 500 --seeds 1 2 --json learning.json --versus ours:torchtitan \\
      --row 'ours yamls/llama1b.yaml global_batch_size=2 model.tie_embeddings=false' \\
      --row 'torchtitan torchtitan:compile FLAVOR=1B LBS=2' \\
      --row 'hf hf:yamls/llama1b.yaml global_batch_size=2 model.tie_embeddings=false' --single-seed hf

Rows as scripts/measure_speed.py's. Every row trains --steps steps with AdamW (lr --lr, betas 0.9/0.95, weight decay
0.1), --warmup steps of linear warm-up then a linear decay to 0, clipping at 1.0, on the same documents in the same
order: Python source of this machine's installed packages, or the --suffix files under --roots (--corpus-mb of
them), torchtitan's test tokenizer (bash ../shared/anchors/prepare.sh). Prints each row's mean loss per --window
steps (mean over seeds, their range) and, for each --versus OURS:THEIRS, whether ours stays within 1 % of theirs from
step 100 on and ends at or below. With --eval-every N every row's held-out loss (--held-out-mb of the pieces the
corpus left out) every N steps, and with --quality REFERENCE:TARGET the time-to-quality table: each row's final
held-out loss beside REFERENCE's at equal tokens (at most 0.5 % above: holds), its tokens and seconds to TARGET's
final held-out loss, how much sooner than TARGET it gets there, and the steps it trains in TARGET's seconds over 1.15.
--report merges runs of another --steps as NAME@STEPS (timed to the target, not compared at equal tokens). --decide
REPORTS applies issue 66's rule to the grid's saved runs (docs/learning.md): the default precision, bf16, or
"none yet" (exit 1) while a recipe lacks a row or a time somewhere; with --speeds the rows' tokens/s of one call
(gpu.sh grid-speed: one machine for every row's speed, where the grid's rows ran on several).
"""
import argparse
import site
import sys

from llmfoundry_ext.measure.learning import decide_command, report_command, train_command


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--row', action='append', default=[], help="'NAME SOURCE key=value ...' (repeatable)")
    parser.add_argument('--report', nargs='+', help='print the table of saved JSON files instead of training')
    parser.add_argument('--rename', action='append', default=[], metavar='[FILE:]OLD=NEW',
                        help="with --report: row OLD (of FILE's rows only) counted as row NEW (the same settings)")
    parser.add_argument('--seeds', type=int, nargs='+', default=[1, 2])
    parser.add_argument('--single-seed', action='append', default=[], help='a row name trained on the first seed only')
    parser.add_argument('--steps', type=int, default=500)
    parser.add_argument('--lr', type=float, default=3e-4)
    parser.add_argument('--warmup', type=int, default=20)
    parser.add_argument('--window', type=int, default=50)
    parser.add_argument('--gpus', type=int, default=1)
    parser.add_argument('--corpus-mb', type=float, default=40.0)
    parser.add_argument('--roots', nargs='+', default=site.getsitepackages(), help='folders of text files (default: '
                        "this Python's installed packages)")
    parser.add_argument('--suffix', default='.py', help="the files' ending under --roots (.rst.txt: the English "
                        'prose of Debian\'s linux-doc, docs/learning.md)')
    parser.add_argument('--torchtitan-ranks', type=int, default=1, help="the corpus in torchtitan's order on N GPUs")
    parser.add_argument('--seq-len', type=int, default=8192, help="tokens a sample (torchtitan's seq_len)")
    parser.add_argument('--work', help='folder for the corpus, shards and rows (default: a temporary one)')
    parser.add_argument('--versus', action='append', default=[], help="'OURS:THEIRS' row names")
    parser.add_argument('--shared-init', metavar='ROW', help="every row of a seed starts from the fresh weights "
                        "ROW's model draws for that seed ('NAME SOURCE key=value ...'; else each row draws its own)")
    parser.add_argument('--eval-every', type=int, default=0, help='held-out loss every so many steps (0: none): '
                        'documents never trained on, the same ones for every row')
    parser.add_argument('--eval-batches', type=int, default=16, help='batches of the local batch an evaluation reads')
    parser.add_argument('--held-out-mb', type=float, default=2.0, help='MB of the pieces the corpus left out to '
                        'evaluate on (with --eval-every)')
    parser.add_argument('--quality', metavar='REFERENCE:TARGET', help='with --eval-every: each row\'s final held-out '
                        'loss beside REFERENCE\'s at equal tokens, and its tokens and seconds to TARGET\'s')
    parser.add_argument('--stop-by', type=float, metavar='SECONDS', help='begin no row that would end more than '
                        'SECONDS after the start, were it as long as the longest so far (a device call\'s limit)')
    parser.add_argument('--transformers-check', metavar='ROW', help="with --eval-every: transformers' model scores "
                        "the held-out batches again on ours row ROW's trained weights (its first seed, one GPU)")
    parser.add_argument('--decide', nargs='+', metavar='REPORT', help="the default precision by the grid's rule: "
                        "the grid's saved runs, any number of calls' files of any cells (docs/learning.md)")
    parser.add_argument('--speeds', nargs='+', metavar='SPEED_JSON', help="with --decide: the rows' tokens/s from "
                        "scripts/measure_speed.py's JSON of one call (gpu.sh grid-speed), not the grid's own runs")
    parser.add_argument('--json', help='write the results here')
    args = parser.parse_args(argv)
    if args.decide:
        return decide_command(args)
    if args.report:
        return report_command(args)
    if not args.row:
        parser.error('give at least one --row, or --report FILES')
    return train_command(args)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
