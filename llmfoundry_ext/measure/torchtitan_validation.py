"""torchtitan's trainer with every validation reading the same held-out samples: ``torchrun ... this file
--job.config_file ...`` in place of ``torchrun ... -m torchtitan.train`` (``benchmark.torchtitan_validating``).

Our own code because the anchor, torchtitan v0.2.2, keeps its validation dataset's position between rounds: each
validation read the batches after the last one's (and one batch more was drawn and dropped each round,
pytorch/torchtitan#2636), so its held-out curve mixed the model's progress with the documents' difficulty.
torchtitan's main branch rebuilds the dataset each round since pytorch/torchtitan#2791; here each round's dataset
goes back to its first document. Nothing else of torchtitan changes: its training, its tokens/s (which leaves
validation out) and its log lines."""
import runpy
import sys


def restart(dataset) -> None:
    """torchtitan's ``HuggingFaceTextDataset`` back at its first document, its token buffer empty."""
    dataset._sample_idx = 0
    dataset._token_buffer = []


def validating_from_the_start(validate):
    """``Validator.validate`` with its dataset restarted first."""
    def validate_from_the_start(self, model_parts, step):
        restart(self.validation_dataloader.dataset)
        return validate(self, model_parts, step)
    return validate_from_the_start


def main() -> None:
    from torchtitan.components.validate import Validator
    Validator.validate = validating_from_the_start(Validator.validate)
    sys.argv[0] = 'torchtitan.train'
    runpy.run_module('torchtitan.train', run_name='__main__', alter_sys=True)


if __name__ == '__main__':
    main()
