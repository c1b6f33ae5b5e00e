"""The demo: stdlib corpus -> BPE tokenizer -> MDS shards -> train on 2 processes, stop, autoresume.

Re-running continues from the latest checkpoint (and says so) instead of starting over.
"""
import os
import subprocess
import sys
import time

from omegaconf import OmegaConf

from llmfoundry_ext.plotting import HELD_OUT_LOSS, plot_run, read_scalars

DEMO_YAML = 'yamls/demo.yaml'
VOCAB_SIZE = 2048
QUEUE_LIMIT_BATCHES = 150  # the first run stops here, as a job at its queue limit would
VAL_EVERY = 10  # every 10th document of each domain is held out for the evaluation


def prepare_data(root: str, window: int) -> None:
    """Tokenizer and, per domain, MDS folders ``<root>/<domain>/train`` and ``/val`` (every VAL_EVERY-th document held
    out); skipped when already there."""
    from data_prep.demo_corpus import demo_corpus
    from data_prep.packing import pack, tokenize_documents, write_mds
    from llmfoundry_ext.data.manifest import file_sha256
    from data_prep.train_tokenizer import EOS, train_bpe

    tokenizer_file = os.path.join(root, 'tokenizer', 'tokenizer.json')
    domains = ('code', 'prose', 'math')
    if os.path.isfile(tokenizer_file) and all(os.path.isdir(os.path.join(root, d, 'val')) for d in domains):
        print(f'demo data: reusing {root}', flush=True)
        return
    start = time.monotonic()
    corpus = demo_corpus()
    tokenizer = train_bpe((doc for docs in corpus.values() for doc in docs), VOCAB_SIZE)
    os.makedirs(os.path.dirname(tokenizer_file), exist_ok=True)
    tokenizer.save(tokenizer_file)
    eos_id = tokenizer.token_to_id(EOS)
    for domain in domains:
        documents = corpus[domain]
        splits = {'train': [d for i, d in enumerate(documents) if i % VAL_EVERY], 'val': documents[::VAL_EVERY]}
        counts = []
        for split, split_documents in splits.items():
            windows = pack(tokenize_documents(split_documents, tokenizer, eos_id), window)
            manifest = write_mds(os.path.join(root, domain, split), windows, {
                'source': f'demo:{domain}', 'split': split, 'documents': len(split_documents), 'window': window,
                'tokenizer': tokenizer_file, 'tokenizer_sha256': file_sha256(tokenizer_file)})
            counts.append(f"{split} {manifest['documents']} documents -> {manifest['windows']} windows")
        print(f"demo data: {domain}: {', '.join(counts)} of {window} tokens", flush=True)
    print(f'demo data: ready in {time.monotonic() - start:.0f} s under {root}', flush=True)


def launch(extra: list[str]) -> None:
    """``composer -n 2 train.py yamls/demo.yaml`` on CPU; one process per GPU, in bf16, where there are GPUs."""
    import torch
    gpus = torch.cuda.device_count()
    on_gpu = ['precision=amp_bf16'] if gpus else []
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    command = ['composer', '-n', str(gpus or 2), 'train.py', DEMO_YAML, *on_gpu, *extra]
    print('$ ' + ' '.join(command), flush=True)
    subprocess.run(command, env=env, check=True)


def main() -> int:
    raw = OmegaConf.load(DEMO_YAML)  # not yet validated: its data does not exist before prepare_data
    prepare_data(raw.variables.data_root, window=raw.max_seq_len)
    checkpoints = raw.checkpoint.save_folder.format(run_name=raw.run_name)
    if not os.path.exists(os.path.join(checkpoints, 'latest-rank0.pt')):
        print(f'\n== run 1: stops after {QUEUE_LIMIT_BATCHES} batches, as at a queue limit ==', flush=True)
        launch([f'callbacks.stop_after.batches={QUEUE_LIMIT_BATCHES}'])
        print('\n== run 2: the same command again: autoresume ==', flush=True)
    else:
        print('\n== a checkpoint exists: the same command autoresumes ==', flush=True)
    launch([])
    print(held_out_curve(os.path.join(checkpoints, 'tensorboard')), flush=True)
    plot = os.path.join(os.path.dirname(checkpoints.rstrip('/')), f'{raw.run_name}.png')
    plot_run(os.path.join(checkpoints, 'tensorboard'), plot)
    print(f'loss and tokens/s curves: {plot} (python scripts/plot_run.py {checkpoints}/tensorboard {plot})', flush=True)
    return 0


def held_out_curve(tensorboard_folder: str) -> str:
    """The held-out loss at each evaluation, over every invocation of the run."""
    points = read_scalars(tensorboard_folder)[HELD_OUT_LOSS]
    return '\nheld-out loss by batch  ' + ' | '.join(f'{batch}: {loss:.2f}' for batch, loss in points)


if __name__ == '__main__':
    sys.exit(main())
