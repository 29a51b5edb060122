"""A Hugging Face Trainer run on a tiny GPT-2 built from a config: nothing is downloaded (tests/test_torchrun_fidelity.py).

    hf_trainer.py --out DIR

Five steps on synthetic token ids made here; rank 0 writes DIR/result.json (the sum of all
parameters, and every parameter's values).
"""

import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

SEED = 0


class TokenIds(torch.utils.data.Dataset):
    """Random token ids; each sequence is its own language-modelling target."""

    def __init__(self, sequences: int = 64, length: int = 16, vocab: int = 64) -> None:
        self.ids = torch.randint(0, vocab, (sequences, length), generator=torch.Generator().manual_seed(SEED))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(out: str) -> None:
    set_seed(SEED)  # the model's initial weights; Trainer seeds again before training
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
    args = TrainingArguments(output_dir=os.path.join(out, "trainer"), max_steps=5, per_device_train_batch_size=4,
                             report_to=[], use_cpu=True, seed=SEED, save_strategy="no")
    trainer = Trainer(model=model, args=args, train_dataset=TokenIds())
    trainer.train()
    if args.process_index == 0:
        checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
        params = {name: p.detach().flatten().tolist() for name, p in model.named_parameters()}
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"checksum": checksum, "params": params}, f)


if __name__ == "__main__":
    main(sys.argv[sys.argv.index("--out") + 1])
