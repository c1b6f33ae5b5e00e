"""llmfoundry_ext: YAML-driven Llama pretraining on Composer and mosaicml-streaming."""
