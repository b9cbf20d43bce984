"""A SYNTHETIC Stable Diffusion pipeline for the image tests: no SD weights ship on PyPI and this
machine reaches no model hub (see ../shared/MODELS.md), so the tests build one.

What is real: the diffusers classes (UNet2DConditionModel, AutoencoderKL, CLIPTextModel, a
scheduler) and their on-disk layout (model_index.json plus one folder per component, safetensors
weights), written with `save_pretrained` exactly as a Hugging Face diffusers repo ships, and the
tokenizer: CLIP's own BPE (49,408 tokens, the vocabulary of openai/clip-vit-large-patch14 that
SD 1.x uses), rebuilt into vocab.json + merges.txt from `bpe_simple_vocab_16e6.txt.gz`, which
the `open-clip-torch` wheel carries (installed with --no-deps; found, never imported).

What is synthetic: every weight. The networks are tiny (about 2M parameters) and randomly
initialised from a fixed seed, so an image is a deterministic function of (prompt, seed, steps,
size), but it depicts nothing. The VAE downsamples by 8 as SD's does, so a 256x256 image is a
32x32 latent, and one denoising step takes a few hundredths of a second here.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

from tests.embedding_models import geniex, package_dir

MODEL = "test/tiny-sd:fp32"  # the name the tests pull it under
CLIP_CONTEXT = 77  # SD 1.x's text length


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible byte -> printable character map (the base of the BPE vocabulary)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def clip_tokenizer_files(dest: Path) -> Path:
    """vocab.json and merges.txt of CLIP's tokenizer, as OpenAI's `SimpleTokenizer` builds its
    vocabulary from the same file: the 256 byte characters, each again with `</w>`, one token
    per merge (the first 48,894 merges), then the two special tokens."""
    gz = package_dir("open_clip") / "bpe_simple_vocab_16e6.txt.gz"
    merges = gzip.decompress(gz.read_bytes()).decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    pairs = [tuple(m.split()) for m in merges]
    vocab = list(bytes_to_unicode().values())
    vocab += [v + "</w>" for v in vocab]
    vocab += ["".join(p) for p in pairs]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}, ensure_ascii=False))
    (dest / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return dest


def build_tiny_sd(dest: Path) -> Path:
    """Write the synthetic pipeline to `dest` (a diffusers folder: model_index.json, unet/, vae/,
    text_encoder/, tokenizer/, scheduler/); returns `dest`."""
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    torch.manual_seed(0)
    tok_dir = clip_tokenizer_files(dest.parent / f"{dest.name}-clip-bpe")
    tokenizer = CLIPTokenizer(str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"), model_max_length=CLIP_CONTEXT)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=37,
            num_attention_heads=4,
            num_hidden_layers=2,
            max_position_embeddings=CLIP_CONTEXT,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    # Attention (to the prompt, and over the latent) only at the lowest resolution, a quarter of the
    # latent's side: at 1792x1024 that is 1,792 positions, where the middle level's 7,168 took 40 s a step.
    unet = UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(8, 16, 32),
        down_block_types=("DownBlock2D", "DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
    )  # fmt: skip
    # Four blocks: the VAE scales by 2**3 = 8, as Stable Diffusion's does.
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(4, 8, 16, 16), layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4, norm_num_groups=4,
        sample_size=256, mid_block_add_attention=False,
    )  # fmt: skip
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False, steps_offset=1,
                              set_alpha_to_one=False)  # fmt: skip
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet,
                                   scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)  # fmt: skip
    pipe.save_pretrained(dest, safe_serialization=True)
    return dest


@functools.cache
def pulled_tiny_sd(base: Path, data_dir: Path) -> str:
    """Build the synthetic pipeline under `base` and import it into `data_dir`'s store with the
    real `geniex pull --local DIR`; returns the model's id."""
    src = build_tiny_sd(base / "tiny-sd")
    assert geniex("pull", "--local", str(src), MODEL, "--data-dir", str(data_dir)) == MODEL
    return MODEL
