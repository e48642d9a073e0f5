"""Write token files for the ``tokens`` task (``tasks/tokens.py``): ``train.bin``, ``val.bin``, ``test.bin`` and
``meta.json`` in ``--out``, from text files and a tokenizer, or (``--random``) a generated corpus for benchmarks.

    python scripts/token_file.py --train ptb.train.txt --val ptb.valid.txt --test ptb.test.txt --out data/ptb-bin
    python scripts/token_file.py --train wiki.valid.tokens --val wiki.test.tokens \\
        --tokenizer transformers:gpt2-tokenizer-folder --out data/wiki-bin
    python scripts/token_file.py --random 10000000 --vocab-size 10000 --out data/random-1e7

Tokenizers: ``ptb-word`` (default) and ``ptb-char`` are the project's PTB vocabularies (``tasks.language``: built
from the train text, the same ids as the ``ptb-word`` / ``ptb-char`` tasks, so the files' evaluation windows are
those tasks' samples); ``transformers:PATH`` a tokenizer saved in a local folder (no hub access). The ids are
uint16 when the vocabulary has at most 65536 tokens, else uint32. Files are written whole, then renamed: a
crash leaves none half-written. Bad input or a failure of the OS is one line, exit code 2.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from gradengines.tasks.language import EOS, UNK, build_vocab, tokenize
from gradengines.tasks.tokens import META

_RANDOM_CHUNK = 1 << 24


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        _fail(f"cannot read {path}: {getattr(err, 'strerror', None) or err}")
        raise  # unreachable


def _dtype(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def _write(path: Path, chunks) -> int:
    """Write the id arrays of ``chunks`` to ``path`` through a temporary file renamed at the end."""
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "wb") as file:
        for ids in chunks:
            ids.astype(ids.dtype.newbyteorder("<")).tofile(file)
            count += ids.size
    os.replace(tmp, path)
    return count


def _ptb(args, level: str) -> tuple[dict, dict]:
    train_tokens = tokenize(_read(args.train), level)
    vocab = build_vocab(train_tokens, level)
    index = {tok: i for i, tok in enumerate(vocab)}
    dtype = np.dtype(_dtype(len(vocab)))
    streams = {}
    for name, path in (("train", args.train), ("val", args.val), ("test", args.test)):
        if path is None:
            continue
        tokens = train_tokens if name == "train" else tokenize(_read(path), level)
        streams[name] = np.fromiter((index.get(t, index[UNK]) for t in tokens), dtype=dtype, count=len(tokens))
    return streams, {"vocab_size": len(vocab), "dtype": dtype.name, "tokenizer": args.tokenizer,
                     "vocab": list(vocab), "eos": index.get(EOS)}


def _transformers(args) -> tuple[dict, dict]:
    folder = args.tokenizer.partition(":")[2]
    try:
        from transformers import AutoTokenizer
    except ImportError:
        _fail("--tokenizer transformers:... needs transformers (bash scripts/setup.sh installs it)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError) as err:
        _fail(f"cannot load a tokenizer from {folder!r} (a local folder; nothing is downloaded): "
              f"{str(err).splitlines()[0]}")
    vocab_size = len(tokenizer)
    dtype = np.dtype(_dtype(vocab_size))
    streams = {}
    for name, path in (("train", args.train), ("val", args.val), ("test", args.test)):
        if path is not None:
            streams[name] = np.asarray(tokenizer(_read(path))["input_ids"], dtype=dtype)
    return streams, {"vocab_size": vocab_size, "dtype": dtype.name, "tokenizer": args.tokenizer}


def _random_chunks(total: int, vocab_size: int, seed: int, dtype: np.dtype):
    rng = np.random.default_rng(seed)
    for start in range(0, total, _RANDOM_CHUNK):
        yield rng.integers(0, vocab_size, min(_RANDOM_CHUNK, total - start), dtype=dtype)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", help="the training text")
    parser.add_argument("--val", help="the validation text")
    parser.add_argument("--test", help="the test text (optional: without it the task halves val.bin)")
    parser.add_argument("--tokenizer", default="ptb-word", help="ptb-word (default), ptb-char or transformers:PATH")
    parser.add_argument("--random", type=int, metavar="N", help="write N uniform random training ids instead: "
                        "a corpus of any size, for benchmarks")
    parser.add_argument("--random-val", type=int, default=100_000, metavar="N",
                        help="ids of val.bin with --random (default 100000, whatever the training size)")
    parser.add_argument("--vocab-size", type=int, help="the vocabulary of --random")
    parser.add_argument("--seed", type=int, default=0, help="seed of --random (default 0)")
    parser.add_argument("--out", required=True, help="the folder to write (made if missing)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.random is not None:
        if args.random < 2 or args.random_val < 2 or not args.vocab_size or args.vocab_size < 1:
            _fail("--random N needs N >= 2, --random-val >= 2 and --vocab-size V >= 1")
        dtype = np.dtype(_dtype(args.vocab_size))
        streams = {"train": _random_chunks(args.random, args.vocab_size, args.seed, dtype),
                   "val": _random_chunks(args.random_val, args.vocab_size, args.seed + 1, dtype)}
        meta = {"vocab_size": args.vocab_size, "dtype": dtype.name, "tokenizer": f"random (seed {args.seed})"}
    else:
        if args.train is None or args.val is None:
            _fail("give --train and --val text files (and --test), or --random N --vocab-size V")
        if args.tokenizer in ("ptb-word", "ptb-char"):
            streams, meta = _ptb(args, args.tokenizer.partition("-")[2])
        elif args.tokenizer.startswith("transformers:"):
            streams, meta = _transformers(args)
        else:
            _fail(f"--tokenizer is ptb-word, ptb-char or transformers:PATH, got {args.tokenizer!r}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        counts = {name: _write(out / f"{name}.bin", ids if not isinstance(ids, np.ndarray) else [ids])
                  for name, ids in streams.items()}
        (out / (META + ".tmp")).write_text(json.dumps(meta) + "\n")
        os.replace(out / (META + ".tmp"), out / META)
    except OSError as err:
        _fail(f"cannot write {out}: {err.strerror or err}")
    sizes = ", ".join(f"{name}.bin {n:,} ids" for name, n in counts.items())
    print(f"wrote {sizes} ({meta['dtype']}, vocabulary {meta['vocab_size']:,}) and {META} in {out}")


if __name__ == "__main__":
    main()
