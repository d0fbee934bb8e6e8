"""What the model picker and `info` show about an offloaded model: where its weights live."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OffloadReport:
    """Where the weights live, for the model picker and `info`. Bytes at the compute dtype."""

    policy: str  # OffloadPolicy.spec()
    device: str
    gpu_bytes: int  # decoder-layer weights on the compute device
    cpu_bytes: int  # in host memory
    disk_bytes: int  # read from the file for each use
    resident_bytes: int  # embeddings, final norm, LM head: always on the compute device
    streamed_bytes_per_token: int  # moved to the compute device for every forward
    cache_host_layers: int  # layers whose KV cache lives in CPU memory
    num_layers: int

    def summary(self) -> str:
        """'decoder layers: 0% on cuda:0, 50% in CPU memory, 50% on disk (...)' for the UI and `info`."""
        mib = 2**20
        total = self.gpu_bytes + self.cpu_bytes + self.disk_bytes or 1
        if self.device.startswith("cpu"):  # computing on the CPU: the GPU and CPU tiers are both RAM
            ram = self.gpu_bytes + self.cpu_bytes
            where = f"{100 * ram / total:.0f}% in RAM ({ram / mib:.0f} MiB)"
        else:
            where = (
                f"{100 * self.gpu_bytes / total:.0f}% on {self.device} ({self.gpu_bytes / mib:.0f} MiB), "
                f"{100 * self.cpu_bytes / total:.0f}% in CPU memory ({self.cpu_bytes / mib:.0f} MiB)"
            )
        text = (
            f"decoder layers: {where}, {100 * self.disk_bytes / total:.0f}% on disk ({self.disk_bytes / mib:.0f} MiB); "
            f"embeddings/head {self.resident_bytes / mib:.0f} MiB resident; "
            f"{self.streamed_bytes_per_token / mib:.0f} MiB streamed per forward"
        )
        if self.cache_host_layers:
            text += f"; KV cache of {self.cache_host_layers}/{self.num_layers} layers in CPU memory"
        return text
