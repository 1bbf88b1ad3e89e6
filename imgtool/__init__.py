"""imgtool: offline container-image packaging for vllm-ascend on Ascend NPU hosts."""

__version__ = "0.1.0"
