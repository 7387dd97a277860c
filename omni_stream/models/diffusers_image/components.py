"""Diffusers pipeline directories: load one component by component (real weights or dummy), save one back.

``model_index.json`` names the pipeline class and, per component folder, its ``[library, class]``. Only classes
of ``diffusers`` and ``transformers`` are ever instantiated (a checkpoint never names code to import). Loading is
ours rather than ``DiffusionPipeline.from_pretrained`` for four reasons: a progress bar per component, dummy
weights at real sizes (every model built from its ``config.json`` with random weights, and a tokenizer built
offline when the directory holds configs only), no safety checker (``safety_checker``, ``feature_extractor`` and
``image_encoder`` are left out), and Qwen-Image-Edit's ``Qwen2VLProcessor``, which insists on a video processor
that needs torchvision: :class:`ImageOnlyQwen2VLProcessor` takes its image processor and tokenizer only.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from omni_stream.errors import ConfigError
from omni_stream.family import LoadOptions

# mypy reads diffusers' top-level names from its __init__'s TYPE_CHECKING branch, the dummy_pt_objects classes (no
# torch.nn.Module or DiffusionPipeline methods): calls of those methods carry a narrow attr-defined ignore.
INDEX = "model_index.json"
SKIPPED = ("safety_checker", "feature_extractor", "image_encoder")
LIBRARIES = ("diffusers", "transformers")
_PROCESSOR = "Qwen2VLProcessor"


def read_index(path: Path) -> dict[str, Any]:
    """The parsed ``model_index.json`` of a pipeline directory (ConfigError when missing or malformed)."""
    try:
        index = json.loads((path / INDEX).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path / INDEX}: {exc}") from exc
    if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
        raise ConfigError(f"{path / INDEX} names no pipeline class (_class_name)")
    return index


def _processor_class() -> type:
    from transformers import Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2VLProcessor without a video processor (that one needs torchvision); saves its two parts."""

        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

        def save_pretrained(self, save_directory: Any, push_to_hub: bool = False, **kwargs: Any) -> Any:
            self.image_processor.save_pretrained(save_directory)
            self.tokenizer.save_pretrained(save_directory)

    return ImageOnlyQwen2VLProcessor


def image_only_processor(image_processor: Any, tokenizer: Any) -> Any:
    """A Qwen2-VL processor of images only."""
    return _processor_class()(image_processor=image_processor, tokenizer=tokenizer, video_processor=None)


def _class(library: str, name: str) -> Any:
    if library not in LIBRARIES:
        raise ConfigError(f"component class {library}.{name}: only diffusers and transformers classes load")
    module = __import__(library)
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ConfigError(f"{library} has no class {name!r} (installed {library} {module.__version__})")
    return cls


def _rank(class_name: str) -> int:
    """Load order: 0 tokenizers, 1 models and schedulers, 2 the processor."""
    return 2 if class_name == _PROCESSOR else 0 if "Tokenizer" in class_name else 1


def _offline_tokenizer(class_name: str) -> Any:
    from omni_stream.models.diffusers_image import text_tokenizers

    tokenizer = text_tokenizers.qwen_tokenizer() if "Qwen" in class_name else text_tokenizers.clip_tokenizer()
    tokenizer.built_offline = True  # a dummy text encoder adopts its special-token ids
    return tokenizer


# A Qwen2.5-VL config's special-token ids, by the token they name (their real ids exceed an offline vocabulary).
_VL_TOKENS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
}


def _adopt_token_ids(config: Any, tokenizer: Any) -> None:
    """Point a dummy text encoder's special-token ids at an offline tokenizer's (they are looked up in forward)."""
    for key, token in _VL_TOKENS.items():
        if getattr(config, key, None) is not None:
            setattr(config, key, tokenizer.convert_tokens_to_ids(token))


def _has_tokenizer_files(folder: Path) -> bool:
    return any((folder / f).is_file() for f in ("tokenizer.json", "vocab.json", "tokenizer_config.json"))


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build random weights in ``dtype`` directly (a 20B model built in float32 first would need twice the memory)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _load_model(cls: Any, folder: Path, dummy: bool, device: str, dtype: torch.dtype, tokenizer: Any = None) -> Any:
    import diffusers

    if issubclass(cls, diffusers.ModelMixin):
        if dummy:
            with torch.device(device), _default_dtype(dtype):
                model = cls.from_config(cls.load_config(folder))
        else:
            model = cls.from_pretrained(folder, torch_dtype=dtype, low_cpu_mem_usage=False)
    else:  # a transformers model
        from transformers import AutoConfig

        if dummy:
            config = AutoConfig.from_pretrained(folder)
            if getattr(tokenizer, "built_offline", False):
                _adopt_token_ids(config, tokenizer)
            with torch.device(device):
                model = cls._from_config(config, dtype=dtype)
        else:
            model = cls.from_pretrained(folder, dtype=dtype)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def _load_component(
    name: str, cls: Any, folder: Path, loaded: dict[str, Any], dummy: bool, device: str, dtype: torch.dtype
) -> Any:
    import diffusers
    from transformers import PreTrainedModel

    if cls.__name__ == _PROCESSOR:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        exists = (folder / "preprocessor_config.json").is_file()  # a dummy directory may hold configs only
        images = Qwen2VLImageProcessorPil.from_pretrained(folder) if exists else Qwen2VLImageProcessorPil()
        tokenizer = loaded.get("tokenizer")
        if tokenizer is None or _has_tokenizer_files(folder):
            tokenizer = _load_tokenizer("Qwen2Tokenizer", folder, dummy)
        return image_only_processor(images, tokenizer)
    if issubclass(cls, diffusers.SchedulerMixin | diffusers.configuration_utils.ConfigMixin) and not issubclass(
        cls, diffusers.ModelMixin
    ):
        return cls.from_pretrained(folder)
    if issubclass(cls, diffusers.ModelMixin | PreTrainedModel):
        return _load_model(cls, folder, dummy, device, dtype, loaded.get("tokenizer"))
    if "Tokenizer" in cls.__name__:
        if dummy and not _has_tokenizer_files(folder):
            return _offline_tokenizer(cls.__name__)
        return cls.from_pretrained(folder)
    raise ConfigError(f"component {name!r} of class {cls.__name__} is not supported")


def _load_tokenizer(name: str, folder: Path, dummy: bool) -> Any:
    if dummy and not _has_tokenizer_files(folder):
        return _offline_tokenizer(name)
    return _class("transformers", name).from_pretrained(folder)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No per-weight progress bars of transformers while the components load (ours counts components)."""
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            transformers_logging.enable_progress_bar()


def load_pipeline(path: Path, options: LoadOptions, dtype: torch.dtype) -> Any:
    """The diffusers pipeline of directory ``path`` on ``options.device`` (``load_format="dummy"``: random weights)."""
    import diffusers
    from diffusers.utils import logging as diffusers_logging

    index = read_index(path)
    pipeline_cls = getattr(diffusers, index["_class_name"], None)
    if not isinstance(pipeline_cls, type) or not issubclass(pipeline_cls, diffusers.DiffusionPipeline):
        raise ConfigError(f"{path / INDEX}: {index['_class_name']!r} is not a diffusers pipeline class")
    entries = {
        name: spec
        for name, spec in index.items()
        if not name.startswith("_") and isinstance(spec, list) and len(spec) == 2 and name not in SKIPPED
    }
    # tokenizers first (a dummy text encoder takes their special-token ids), the processor (it wraps one) last
    order = sorted(entries, key=lambda n: (_rank(entries[n][1]), n))
    dummy = options.load_format == "dummy"
    components: dict[str, Any] = {}
    diffusers_logging.set_verbosity_error()  # its accelerate hints and per-call warnings
    with options.progress_bar(total=len(order), desc=f"loading {path.name}", unit="part") as bar, _quiet():
        for name in order:
            library, class_name = entries[name]
            if library is None:
                components[name] = None
            else:
                folder = path / name
                if not folder.is_dir() and not (dummy and _rank(class_name) != 1):
                    raise ConfigError(f"{path} has no {name}/ folder ({INDEX} lists it)")
                cls = _class(library, class_name)
                components[name] = _load_component(name, cls, folder, components, dummy, options.device, dtype)
            bar.set_postfix_str(name)
            bar.update(1)
    params = inspect.signature(pipeline_cls).parameters
    for name in SKIPPED:
        if name in params:
            components[name] = None
    if "requires_safety_checker" in params:
        components["requires_safety_checker"] = False
    missing = [p for p, v in params.items() if v.default is inspect.Parameter.empty and p not in components]
    if missing:
        raise ConfigError(f"{path}: {index['_class_name']} needs {', '.join(missing)} ({INDEX} does not list it)")
    pipe = pipeline_cls(**{k: v for k, v in components.items() if k in params})
    pipe.set_progress_bar_config(disable=True)  # type: ignore[attr-defined]  # a diffusers dummy class to mypy
    return pipe


def save_pipeline(pipe: Any, out: Path) -> Path:
    """Write ``pipe`` in the diffusers layout (safetensors); an image-only Qwen processor is recorded as
    ``transformers.Qwen2VLProcessor``, as the published checkpoints name it."""
    out.mkdir(parents=True, exist_ok=True)
    with _quiet():
        pipe.save_pretrained(out, safe_serialization=True)
    index = read_index(out)
    for name, spec in index.items():
        if isinstance(spec, list) and len(spec) == 2 and spec[1] == "ImageOnlyQwen2VLProcessor":
            index[name] = ["transformers", _PROCESSOR]
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return out
