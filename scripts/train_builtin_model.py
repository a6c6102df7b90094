"""Train kvserve's small built-in model: a ~5.6M-parameter LlamaForCausalLM on Jane Austen's novels.

Corpus: Debian package ``r-cran-janeaustenr`` 1.0.0-1 (the six completed novels as Project
Gutenberg text; the novels are public domain, the package is MIT). The script fetches the .deb with
``apt-get download`` (no R needed), checks its SHA-256, and decodes the six character vectors from
the R lazy-load database ``data/Rdata.rdb`` with a minimal reader of R's XDR serialization.

Run (about 30 minutes on one CPU core)::

    python scripts/train_builtin_model.py --out src/kvserve/builtin_model

Outputs a standard Hugging Face folder: config.json, model.safetensors, generation_config.json,
tokenizer.json, tokenizer_config.json, chat_template.jinja, training_log.json, corpus_words.txt.

The built-in model's draft (``src/kvserve/builtin_model/draft``, for speculative decoding) is the
same script with the built-in model's tokenizer and a smaller shape; its command is in
``docs/builtin_model.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import re
import struct
import subprocess
import tempfile
import time
import zlib
from hashlib import sha256
from pathlib import Path

import torch

DEB_NAME = "r-cran-janeaustenr"
DEB_VERSION = "1.0.0-1"
DEB_SHA256 = "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95"
RDB_PATH = "usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# ---------------------------------------------------------------- corpus
def fetch_corpus_deb(workdir: Path) -> Path:
    """Download the pinned .deb into ``workdir`` (running ``apt-get update`` first if apt cannot
    find it), verify its SHA-256, unpack it; return the path of the .rdb file."""
    download = ["apt-get", "download", f"{DEB_NAME}={DEB_VERSION}"]
    if subprocess.run(download, cwd=workdir).returncode != 0:
        subprocess.run(["apt-get", "update"], check=True)  # fresh machines have no package lists
        subprocess.run(download, cwd=workdir, check=True)
    deb = next(workdir.glob(f"{DEB_NAME}_*.deb"))
    digest = sha256(deb.read_bytes()).hexdigest()
    if digest != DEB_SHA256:
        raise RuntimeError(f"{deb.name}: sha256 {digest}, expected {DEB_SHA256}")
    subprocess.run(["dpkg-deb", "-x", str(deb), str(workdir / "root")], check=True)
    return workdir / "root" / RDB_PATH


def _read_strsxp(buf: bytes) -> list[str]:
    """Decode one R-serialized (format 'X', version 3) plain character vector."""
    if buf[:2] != b"X\n":
        raise ValueError("not an XDR-serialized R object")
    pos = 2 + 12
    (enc_len,) = struct.unpack_from(">i", buf, pos)
    pos += 4 + enc_len
    flags, length = struct.unpack_from(">ii", buf, pos)
    if flags & 0xFF != 16:
        raise ValueError(f"expected a character vector (STRSXP=16), got type {flags & 0xFF}")
    pos += 8
    lines = []
    for _ in range(length):
        _, n = struct.unpack_from(">ii", buf, pos)
        pos += 8
        lines.append("" if n < 0 else buf[pos:pos + n].decode("utf-8"))
        pos += max(n, 0)
    return lines


def read_novels(rdb: Path) -> dict[str, list[str]]:
    """Return {title: lines} for every record of an R lazy-load database (4-byte length + zlib)."""
    data, pos, novels = rdb.read_bytes(), 0, {}
    while pos < len(data):
        z = zlib.decompressobj()
        raw = z.decompress(data[pos + 4:])
        pos = len(data) - len(z.unused_data)
        lines = _read_strsxp(raw)
        title = next(line for line in lines if line.strip()).strip()
        novels[title] = lines
    return novels


def to_paragraphs(lines: list[str]) -> list[str]:
    """Join hard-wrapped lines into paragraphs; drop italics underscores and squeeze spaces."""
    paragraphs, current = [], []
    for line in lines + [""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            text = re.sub(r"\s+", " ", " ".join(current).replace("_", ""))
            paragraphs.append(text)
            current = []
    return paragraphs


def chat_examples(paragraphs: list[str], rng: random.Random, n: int) -> list[str]:
    """Chat-format data: the user gives the first half of a sentence, the assistant continues."""
    sentences = [s for p in paragraphs for s in re.split(r"(?<=[.!?])\s+", p) if len(s.split()) >= 8]
    out = []
    for sentence in rng.sample(sentences, min(n, len(sentences))):
        words = sentence.split()
        cut = len(words) // 2
        user, reply = " ".join(words[:cut]), " ".join(words[cut:])
        out.append(f"<s><|user|>\n{user}</s>\n<|assistant|>\n{reply}</s>\n")
    return out


def corpus_words(paragraphs: list[str]) -> list[str]:
    """Sorted set of lowercase words (letters and apostrophes) in the corpus."""
    return sorted({w for p in paragraphs for w in re.findall(r"[a-z]+(?:'[a-z]+)*", p.lower())})


# ---------------------------------------------------------------- tokenizer and model
def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style pre-tokenizer) trained by ``tokenizers`` on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def build_model(args, vocab_size: int, tok):
    """A randomly initialised LlamaForCausalLM of the shape given by the flags (float32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=args.context,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True, initializer_range=0.02,
        bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"),
        pad_token_id=tok.token_to_id("<pad>"))
    return LlamaForCausalLM(config)


# ---------------------------------------------------------------- training
def lr_at(step: int, args) -> float:
    """Linear warm-up then cosine decay to 10% of ``--lr`` at ``--max-steps``."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, args.max_steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def sample_batch(streams, weights, args, gen: torch.Generator) -> torch.Tensor:
    """[batch, context+1] int64 windows at random offsets; each row's stream drawn by ``weights``."""
    picks = torch.multinomial(torch.tensor(weights), args.batch_size, True, generator=gen)
    rows = []
    for k in picks.tolist():
        s = streams[k]
        start = int(torch.randint(0, len(s) - args.context - 1, (1,), generator=gen))
        rows.append(s[start:start + args.context + 1])
    return torch.stack(rows)


def loss_on(model, batch: torch.Tensor, autocast: bool) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of a [B, T+1] int64 batch; scalar float32."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=batch[:, :-1]).logits
    return torch.nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, val: torch.Tensor, args) -> float:
    """Mean loss over the first ``--eval-windows`` consecutive windows of the held-out stream."""
    model.eval()
    n = args.context + 1
    windows = val[: (len(val) // n) * n].view(-1, n)[: args.eval_windows]
    losses = [loss_on(model, windows[i:i + 16], args.autocast).item()
              for i in range(0, len(windows), 16)]
    model.train()
    return sum(losses) / len(losses)


def train(model, streams, weights, val, args) -> dict:
    """AdamW loop; returns steps, tokens seen, seconds and the loss and validation curves."""
    gen = torch.Generator().manual_seed(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.1, fused=False)
    curve, val_curve, t0, step = [], [], time.time(), 0
    while step < args.max_steps:
        if time.time() - t0 > args.max_minutes * 60:
            print(f"stopping at step {step}: --max-minutes {args.max_minutes} reached", flush=True)
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        loss = loss_on(model, sample_batch(streams, weights, args, gen), args.autocast)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.log_every == 0 or step == 1:
            curve.append({"step": step, "loss": round(loss.item(), 4),
                          "lr": lr_at(step - 1, args), "elapsed_s": round(time.time() - t0, 1)})
            print(json.dumps(curve[-1]), flush=True)
        if step % args.eval_every == 0 or step == args.max_steps:
            val_curve.append({"step": step, "val_loss": round(evaluate(model, val, args), 4)})
            print(json.dumps(val_curve[-1]), flush=True)
    if not val_curve or val_curve[-1]["step"] != step:
        val_curve.append({"step": step, "val_loss": round(evaluate(model, val, args), 4)})
    return {"steps": step, "tokens_seen": step * args.batch_size * args.context,
            "train_seconds": round(time.time() - t0, 1), "loss_curve": curve,
            "val_curve": val_curve}


# ---------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("src/kvserve/builtin_model"))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    p.add_argument("--max-minutes", type=float, default=40.0,
                   help="safety stop; the default run needs ~20-35 min on one shared core")
    p.add_argument("--max-steps", type=int, default=650)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--tokenizer", type=Path, default=None,
                   help="a model folder whose tokenizer.json to use instead of training one (a draft model\n"
                        "for that model: same tokenizer; --vocab-size is then ignored)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=768)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--chat-share", type=float, default=0.12, help="share of chat-format rows")
    p.add_argument("--autocast", action=argparse.BooleanOptionalAction, default=True,
                   help="bf16 autocast (AMX); weights and optimizer state stay float32")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-windows", type=int, default=64)
    return p.parse_args(argv)


def prepare_data(args, rng: random.Random):
    """Fetch and split the corpus; train the tokenizer; return everything training needs."""
    with tempfile.TemporaryDirectory() as tmp:
        novels = read_novels(fetch_corpus_deb(Path(tmp)))
    train_texts, val_texts, all_paragraphs = [], [], []
    for lines in novels.values():
        paragraphs = to_paragraphs(lines)
        cut = int(len(paragraphs) * 0.98)  # the last 2% of each novel is held out
        train_texts.append("\n\n".join(paragraphs[:cut]))
        val_texts.append("\n\n".join(paragraphs[cut:]))
        all_paragraphs.extend(paragraphs[:cut])
    chats = chat_examples(all_paragraphs, rng, 20000)
    if args.tokenizer is not None:  # a draft model shares its target's tokenizer exactly
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    else:
        tok = train_tokenizer(train_texts + chats, args.vocab_size)

    def encode(texts):
        return torch.tensor([i for t in texts for i in tok.encode("<s>" + t + "</s>").ids])

    prose = encode(train_texts)
    chat = torch.tensor([i for c in chats for i in tok.encode(c).ids])
    corpus = {"package": DEB_NAME, "version": DEB_VERSION, "deb_sha256": DEB_SHA256,
              "file": "/" + RDB_PATH, "novels": list(novels),
              "licence": "novels: public domain (Project Gutenberg texts); package: MIT "
                         "(c) 2016-2017 Julia Silge",
              "characters": sum(len(t) for t in train_texts + val_texts),
              "train_tokens": len(prose), "chat_examples": len(chats), "chat_tokens": len(chat)}
    return tok, [prose, chat], encode(val_texts), corpus, corpus_words(all_paragraphs)


def save(model, tok, out: Path, log: dict, words: list[str]) -> None:
    """Write the Hugging Face folder; weights in float32."""
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=model.config.eos_token_id,
                     pad_token_id=model.config.pad_token_id).save_pretrained(out)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                     pad_token="<pad>", model_max_length=model.config.max_position_embeddings)
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.save_pretrained(out)
    (out / "training_log.json").write_text(json.dumps(log, indent=1) + "\n")
    (out / "corpus_words.txt").write_text("\n".join(words) + "\n")


def machine_info(threads: int) -> dict:
    """Platform, CPU model name and count, torch version and threads used (for training_log)."""
    cpuinfo = Path("/proc/cpuinfo")
    names = re.findall(r"model name\s*:\s*(.+)", cpuinfo.read_text()) if cpuinfo.exists() else []
    return {"platform": platform.platform(), "cpu": names[0] if names else platform.processor(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "threads": threads}


def main(argv=None) -> None:
    args = parse_args(argv)
    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok, streams, val, corpus, words = prepare_data(args, rng)
    print(json.dumps(corpus), flush=True)
    model = build_model(args, tok.get_vocab_size(), tok)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params}", flush=True)
    result = train(model, streams, [1 - args.chat_share, args.chat_share], val, args)
    log = {"corpus": corpus, "seed": args.seed, "parameters": n_params,
           "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           **result, "wall_seconds": round(time.time() - t_start, 1),
           "machine": machine_info(args.threads)}
    save(model, tok, args.out, log, words)
    print(f"saved to {args.out}; final val loss {result['val_curve'][-1]['val_loss']}", flush=True)


if __name__ == "__main__":
    main()
