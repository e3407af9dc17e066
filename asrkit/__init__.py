"""asrkit: speech recognition models that differ only in how they encode position."""
__version__ = "0.1.0"
