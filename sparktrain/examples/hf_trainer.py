"""Hugging Face's ``Trainer``, unchanged, on Spark ranks: a tiny BERT reads the digits.

Each 8x8 digit becomes a sentence of 16 tokens (its 2x2 patches, each pixel on or off) and a
two-layer BERT built from a config (nothing downloaded) learns to classify them with
``transformers.Trainer``. The Trainer finds the run's world in the environment sparktrain
sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``PORT``), as under torchrun.

Run it::

    python -m sparktrain.examples.hf_trainer             # 2 ranks on Spark executors
    python -m sparktrain.examples.hf_trainer --np -2     # 2 ranks here, no Spark

Needs ``pip install 'sparktrain[frameworks,examples]'`` (transformers, accelerate,
scikit-learn).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from sparktrain.examples import _common, _data

EPOCHS, LR, BATCH_SIZE = 10, 0.005, 32
VOCAB, LENGTH = 16, 16  # a token per 2x2 patch: 16 patches, 16 on/off patterns


def train(epochs: int, lr: float, batch_size: int, out_dir: str) -> dict[str, Any]:
    """Train and score the tiny BERT with ``transformers.Trainer`` on every rank.

    Args:
        epochs: training epochs.
        lr: AdamW's learning rate.
        batch_size: per-rank batch size.
        out_dir: the Trainer's ``output_dir`` (nothing is saved there by default).

    Returns:
        ``loss`` (the training loss), ``accuracy`` (test), ``steps``, and what the Trainer
        saw: ``world_size``, ``process_index``, ``device``.
    """
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # a config, never a download
        os.environ[name] = "1"
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    x_train, y_train, x_test, y_test = _data.digits_tensors()

    def tokens(x: torch.Tensor) -> torch.Tensor:
        """Each 2x2 patch of the 8x8 image, on or off per pixel, as one of 16 token ids."""
        bits = (x > 0).long().reshape(-1, 4, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(-1, 16, 4)
        return (bits * torch.tensor([8, 4, 2, 1])).sum(-1)

    train_set = [
        {"input_ids": ids, "labels": label}
        for ids, label in zip(tokens(x_train), y_train, strict=True)
    ]
    test_set = [
        {"input_ids": ids, "labels": label}
        for ids, label in zip(tokens(x_test), y_test, strict=True)
    ]
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=LENGTH,
    )
    config.num_labels = 10  # a property in transformers 5, not a keyword its types know
    model = BertForSequenceClassification(config)
    args = TrainingArguments(
        output_dir=out_dir,
        num_train_epochs=epochs,
        per_device_train_batch_size=batch_size,
        per_device_eval_batch_size=128,
        learning_rate=lr,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_strategy="epoch",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )

    def accuracy(prediction: Any) -> dict[str, float]:
        logits, labels = prediction
        return {"accuracy": float((logits.argmax(-1) == labels).mean())}

    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=test_set,
        compute_metrics=accuracy,
    )
    trained = trainer.train()
    scores = trainer.evaluate()  # each rank scores its share; the Trainer gathers them
    return {
        "loss": trained.training_loss,
        "losses": [row["loss"] for row in trainer.state.log_history if "loss" in row],
        "accuracy": scores["eval_accuracy"],
        "steps": trainer.state.global_step,
        "world_size": args.world_size,
        "process_index": args.process_index,
        "device": str(args.device),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run :func:`train` on ``--np`` ranks as the command line ``argv`` says; return its result."""
    from sparktrain import SparkRunner

    parser = _common.make_parser(
        "hf_trainer",
        "Hugging Face's Trainer on Spark ranks: a tiny BERT classifies the bundled digits.",
        epochs=EPOCHS,
        lr=LR,
        batch_size=BATCH_SIZE,
        data=False,
        checkpoints=False,
    )
    parser.add_argument(
        "--out-dir",
        default=os.path.abspath(os.path.join("sparktrain-out", "hf_trainer")),
        help="the Trainer's output_dir (default ./sparktrain-out/hf_trainer)",
    )
    args = _common.parse(parser, argv)
    _common.require(args, "transformers", "accelerate", "sklearn")
    print(
        "Data: scikit-learn's bundled handwritten digits as 16-token sentences "
        f"({1797 - _data.DIGITS_TEST_SIZE} train / {_data.DIGITS_TEST_SIZE} test), no download",
        flush=True,
    )
    print(f"Job: transformers.Trainer, tiny BERT, {_common.where(args.np)}", flush=True)
    with _common.spark_for(args.np, args.master) as spark:
        result = SparkRunner(np=args.np, spark=spark).run(
            train, args.epochs, args.lr, args.batch_size, os.path.abspath(args.out_dir)
        )
    print(
        f"The Trainer saw world size {result['world_size']} on {result['device']}; "
        f"{result['steps']} steps, training loss {result['loss']:.4f}, "
        f"test accuracy {result['accuracy']:.2%}",
        flush=True,
    )
    return {**result, "np": args.np}


if __name__ == "__main__":
    # Run under the importable name, so cloudpickle ships train by reference.
    from sparktrain.examples import hf_trainer

    hf_trainer.main()
