"""Train a byte-level BPE tokenizer (HF ``tokenizers``) with Llama-3-style BOS/EOS tokens."""
import argparse
import itertools
import json
import os
import sys
from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data_prep.sources import Counts, SourceError, parse_source

BOS, EOS = '<|begin_of_text|>', '<|end_of_text|>'


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of ``vocab_size`` ids, ids 0 and 1 being BOS and EOS."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def main(argv: list[str]) -> int:
    """python data_prep/train_tokenizer.py --source jsonl:'/data/*.jsonl' --vocab-size 32000 --out tokenizers/mine"""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--source', required=True, help='as for convert_to_mds.py')
    parser.add_argument('--input')
    parser.add_argument('--text-column', default='text')
    parser.add_argument('--vocab-size', type=int, required=True)
    parser.add_argument('--max-docs', type=int, help='train on the first N documents only')
    parser.add_argument('--out', required=True, help='folder for tokenizer.json and tokenizer_config.json')
    args = parser.parse_args(argv)
    try:
        source = parse_source(args.source, args.input, args.text_column)
        source.check()
    except SourceError as error:
        print(f'error: {error}', file=sys.stderr)
        return 2
    counts = Counts()
    documents = (d.text for file in source.files() for d in source.documents(file, counts))
    tokenizer = train_bpe(itertools.islice(documents, args.max_docs), args.vocab_size)
    os.makedirs(args.out, exist_ok=True)
    tokenizer.save(os.path.join(args.out, 'tokenizer.json'))
    with open(os.path.join(args.out, 'tokenizer_config.json'), 'w') as file:
        json.dump({'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': BOS, 'eos_token': EOS}, file)
    print(f'wrote {args.out}: {tokenizer.get_vocab_size():,} ids; skipped {counts.skipped or "nothing"}')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
