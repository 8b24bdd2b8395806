"""atom-image-pipeline: ship ROCm ATOM images whose ATOM and aiter are proven compatible."""

__version__ = "0.1.0"
