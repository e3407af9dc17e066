"""asrkit: speech recognition models that differ only in how they encode position."""
__version__ = "0.1.0"


def __getattr__(name: str):
    # ``asrkit.load_model`` without importing torch for ``import asrkit`` (lazy, PEP 562)
    if name == "load_model":
        from asrkit.inference import load_model

        return load_model
    raise AttributeError(f"module 'asrkit' has no attribute {name!r}")
