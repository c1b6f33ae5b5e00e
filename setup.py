"""llmfoundry_ext: YAML-driven Llama pretraining on Composer and mosaicml-streaming."""
from setuptools import find_packages, setup

install_requires = [
    'mosaicml>=0.32.1,<0.33',          # Composer; its stale torch pin is overridden (overrides.txt, Makefile)
    'mosaicml-streaming>=0.13.0,<0.14',
    'zstd>=1.5',                       # MDS shards' compression, as streaming writes it (llmfoundry_ext.data.mds)
    'xxhash>=3',                       # MDS shards' checksums, as streaming records and checks them (data/mds.py)
    'transformers>=4.56',              # from_pretrained's dtype (torch_dtype warns from 4.56)
    'tokenizers>=0.21',
    'datasets>=3.0',
    'omegaconf>=2.3',
    'safetensors>=0.4',
    'tqdm>=4.66',
    'tensorboard>=2.14',               # the default logger
    'boto3',                           # Stack-v2 contents from S3
    'psutil>=5.8',                     # run_lock: whether a lock's holder still runs (Composer's dependency too)
    'matplotlib>=3.7',                 # scripts/plot_run.py
]

extras_require = {
    # wheels only: liger-kernel's fused kernels, torchao's float8, nvidia-ml-py for GPU utilisation
    'gpu': ['liger-kernel>=0.8.3', 'torchao>=0.17', 'nvidia-ml-py>=12'],
    'flash': ['flash-attn>=2.6'],  # built from source against the installed torch: docs/install.md
    'eval': ['lm_eval>=0.4.9,<0.5'],  # downstream tasks (llmfoundry_ext/downstream.py)
    # moto: a local S3 for tests; xdist: make test runs two tests at a time (most wait on process start-up);
    # lm_eval's hf extra: its HF backend, which the downstream tests compare ours with
    'dev': ['pytest>=8', 'pytest-timeout>=2.3', 'pytest-xdist>=3.5', 'pyyaml', 'moto[server]>=5',
            'lm_eval[hf]>=0.4.9,<0.5'],
}

setup(
    name='llmfoundry_ext',
    version='0.1.0',
    description=__doc__,
    packages=find_packages(include=['llmfoundry_ext', 'llmfoundry_ext.*', 'data_prep']),
    python_requires='>=3.10',
    install_requires=install_requires,
    extras_require=extras_require,
)
