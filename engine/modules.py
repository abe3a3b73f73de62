"""Packed weights: the only parts of the engine that hold GGUF blocks. Each keeps the
file's bytes (a uint8 tensor over the memory map, or a copy on another device) and
calls the kernels its model's settings (kernels.KernelSettings, handed over at build)
chose once for its device and type; nothing here dequantizes a whole weight. Plain
callables, not nn.Modules: a decode step makes a hundred of these calls and
nn.Module's call machinery would cost more than some of them."""

from __future__ import annotations

import torch

from ..gguf_io import GGMLType, GGUFReader, TensorInfo
from . import lora as lora_rows
from .kernels import REFERENCE, KernelSettings, cpu
from .graphs import capturing
from .kernels.reference import as_tensor
from .errors import WeightError


class GgufLinear:
    """y = x @ W.T (+ bias) for W packed as GGUF rows (out_features, row_bytes)."""

    def __init__(self, name: str, packed: torch.Tensor, ggml_type: GGMLType, in_features: int, out_features: int,
                 bias: torch.Tensor | None = None, products: torch.dtype | None = None, *, settings: KernelSettings):
        """`products`: the dtype a float matrix (F16, BF16) is multiplied in by torch (the
        vision towers' bfloat16 on CPUs that compute it natively); None: the native kernels'
        float32 dots where they are in use, else the input's dtype. `settings`: the model's kernel settings."""
        self.name = name
        self.packed = packed
        self.ggml_type = GGMLType(ggml_type)
        self.in_features, self.out_features = in_features, out_features
        self.bias = bias
        self.kernels = settings.select(packed.device, self.ggml_type)
        self.lora: lora_rows.Stack | None = None  # the LoRA adapters on it (engine.lora.attach)
        self.native = None  # what the native CPU kernels read: (bytes, type code), the file's or repacked
        self.repacked = False
        if products is not None and self.ggml_type in (GGMLType.F16, GGMLType.BF16):
            # the vision towers' float matrices: torch's product in that dtype (a patch grid's
            # hundreds of rows at once), not the float32 dots the native kernels have for them
            self._call = lambda x: REFERENCE.mul_mat(self.packed, x.to(products), self.ggml_type,
                                                     self.out_features).to(x.dtype)
        elif self.kernels.native_cpu:
            k = self.kernels.cpu
            rep = k.repacked(packed, self.ggml_type, out_features, in_features)
            self.repacked = rep is not None
            self.native = rep or (packed, int(self.ggml_type))
            self._call = cpu.MulMat(k, packed, self.ggml_type, out_features, in_features, native=self.native)
        else:
            self._call = lambda x: self.kernels.mul_mat(self.packed, x, self.ggml_type, self.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self._call(x)
        y = y if self.bias is None else y + self.bias
        return y if self.lora is None else lora_rows.add(y, x, self.lora)

    def __repr__(self) -> str:
        return f"GgufLinear({self.name}, {self.in_features} -> {self.out_features}, {self.ggml_type.name})"


class DenseLinear:
    """y = x @ W.T for a float32 matrix stored unquantized (routers, small gates)."""

    def __init__(self, name: str, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 native: cpu.CpuKernels | None = None):
        """`native`: the model's native CPU kernels where they are in use (its threads run the
        few-row products)."""
        self.name, self.weight, self.bias = name, weight, bias
        self.out_features, self.in_features = weight.shape
        self.lora: lora_rows.Stack | None = None  # as GgufLinear's
        self._native = None
        if native is not None and weight.device.type == "cpu" and weight.dtype is torch.float32:
            self._native = cpu.LinearF32(native, weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._native is not None and (y := self._native(x)) is not None:
            y = y if self.bias is None else y.add_(self.bias)
        else:
            y = torch.nn.functional.linear(x, self.weight.to(x.dtype), self.bias)
        return y if self.lora is None else lora_rows.add(y, x, self.lora)


class LinearGroup:
    """Matrices that read the same input (q/k/v, gate/up) as one: the output is their
    outputs side by side, (n, sum of out_features). With the native CPU kernels and a
    batch of at most their gemv_max_rows rows that is one native call (the input quantized
    once, the rows of all of them one work list); otherwise one by one."""

    def __init__(self, linears: list):
        self.linears = linears
        self.sizes = [m.out_features for m in linears]
        self.out_features, self.in_features = sum(self.sizes), linears[0].in_features
        self.native = None
        if len(linears) > 1 and all(isinstance(m, GgufLinear) and m.kernels.native_cpu for m in linears):
            self.native = cpu.MulMatGroup(linears[0].kernels.cpu, [m.native[0] for m in linears],
                                          [m.native[1] for m in linears], self.sizes, linears[0].in_features)
            self._max_rows = self.native.max_rows
            self.bias = None
            if any(m.bias is not None for m in linears):
                self.bias = torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features) for m in linears])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.native is not None and x.shape[0] <= self._max_rows and x.dtype is torch.float32:
            y = self.native(x)
            y = y if self.bias is None else y.add_(self.bias)
            start = 0
            for m, n in zip(self.linears, self.sizes):  # the members' adapters, each on its own columns
                if m.lora is not None:
                    y[:, start:start + n] = lora_rows.add(y[:, start:start + n], x, m.lora)
                start += n
            return y
        return torch.cat([m(x) for m in self.linears], dim=-1)


class GgufEmbedding:
    """Row lookup into a packed (num_embeddings, row_bytes) table, times `scale`."""

    def __init__(self, name: str, packed: torch.Tensor, ggml_type: GGMLType, num_embeddings: int, dim: int,
                 dtype: torch.dtype, scale: float | None = None, *, settings: KernelSettings):
        self.name, self.packed, self.ggml_type = name, packed, GGMLType(ggml_type)
        self.num_embeddings, self.dim, self.dtype, self.scale = num_embeddings, dim, dtype, scale
        self.kernels = settings.select(packed.device, self.ggml_type)
        self._scale = None if scale is None else torch.tensor(scale, dtype=dtype)
        self._rows = None  # the native row-by-row lookup for a decode step's few ids
        if self.kernels.native_cpu and dtype is torch.float32 and packed.dim() == 2:
            self._rows = cpu.RowLookup(self.kernels.cpu, packed, self.ggml_type, dim)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        few = None  # a decode step's ids as a list, for the row-by-row lookup
        if self._rows is not None and ids.dim() == 1 and ids.numel() <= self._rows.MAX_IDS:
            few = ids.tolist()
        if ids.numel() and not capturing(ids):  # a captured decode step's ids are the model's own samples
            lo, hi = (min(few), max(few)) if few is not None else (int(ids.min()), int(ids.max()))
            if lo < 0 or hi >= self.num_embeddings:
                raise IndexError(f"token id out of range 0..{self.num_embeddings - 1}")
        if few is not None:
            out = self._rows(few)
        else:
            out = self.kernels.get_rows(self.packed, ids, self.ggml_type, self.dim, self.dtype)
        return out if self._scale is None else out * self._scale


class GgufExperts:
    """A mixture-of-experts feed-forward over packed expert tensors (llama.cpp's
    ffn_gate_exps / ffn_up_exps / ffn_down_exps, or a fused ffn_gate_up_exps, `gate_up`,
    whose 2I rows per expert are gate then up: one product gives both):
    y[t, k] = down_e(act(gate_e(x_t)) · up_e(x_t)), e = ids[t, k] (the caller weights and
    sums them). `biases` (gpt-oss): per expert the gate, up and down biases, (E, I), (E, I)
    and (E, hidden) float32, added to each product."""

    def __init__(self, name: str, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
                 types: tuple[GGMLType, GGMLType, GGMLType], hidden: int, intermediate: int,
                 biases: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 gate_up: torch.Tensor | None = None, *, settings: KernelSettings):
        self.name = name
        self.gate_up_bias = self.down_bias = None
        if biases is not None:
            self.gate_up_bias = torch.cat(biases[:2], dim=1)  # (E, 2I): a row per expert, as the pair's output
            self.down_bias = biases[2]
        self.gate, self.up, self.down, self.gate_up = gate, up, down, gate_up
        self.types = tuple(GGMLType(t) for t in types)
        self.num_experts = gate.shape[0]
        self.hidden, self.intermediate = hidden, intermediate
        self.kernels = [settings.select(gate.device, t) for t in self.types]
        # the matrices the kernels multiply: (tensor, rows per expert, columns, type, kernels),
        # gate and up as one if fused
        gk, uk, dk = self.kernels
        mats = ([(gate_up, 2 * intermediate, hidden, self.types[0], gk)] if gate_up is not None else
                [(gate, intermediate, hidden, self.types[0], gk), (up, intermediate, hidden, self.types[1], uk)])
        mats.append((down, hidden, intermediate, self.types[2], dk))
        # per matrix what the kernels read: (bytes, type code), the file's or, for the native
        # CPU kernels where the type has a faster layout (MXFP4 with AVX2), repacked at load
        self.native = [(w, int(t)) for w, _, _, t, _ in mats]
        self.repacked = [False] * len(mats)
        self._pair = None  # separate gate and up in one native call
        if any(k.native_cpu for k in self.kernels):
            for i, (w, rows, cols, t, k) in enumerate(mats):
                if not k.native_cpu:
                    continue
                e = w.shape[0]
                rep = k.cpu.repacked(w.reshape(e * rows, -1), t, e * rows, cols)
                if rep is not None:  # all experts as one matrix: each expert's rows are whole groups
                    self.native[i], self.repacked[i] = (rep[0].view(e, rows, -1), rep[1]), True
            if gate_up is None and gk.native_cpu and uk.native_cpu:
                self._pair = gk.cpu.mul_mat_id2

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, ops, act: str) -> torch.Tensor:
        """(T, k, hidden) for x (T, hidden) and ids (T, k); `ops` (kernels.ops) applies
        the activation `act` to the gate and multiplies by up."""
        gk, uk, dk = self.kernels
        t, k, n = ids.shape[0], ids.shape[1], self.intermediate
        (dw, dt) = self.native[-1]
        both = None
        if self.gate_up is not None:
            (gw, gt) = self.native[0]
            both = gk.mul_mat_id(gw, x, ids, gt, 2 * n)
        else:
            (gw, gt), (uw, ut) = self.native[:2]
            if self._pair is not None:  # None where the pair's types or the batch do not fit one call
                both = self._pair(gw, uw, x, ids, gt, ut, n)
        if both is not None:
            both = both.reshape(t * k, 2 * n)
            if self.gate_up_bias is not None:
                both = both + self.gate_up_bias[ids.reshape(-1)].to(both.dtype)
            h = ops.gated_mul(both.contiguous(), n, act).view(t, k, n)
        else:
            g = gk.mul_mat_id(gw, x, ids, gt, n)
            u = uk.mul_mat_id(uw, x, ids, ut, n)
            if self.gate_up_bias is not None:
                gu = self.gate_up_bias[ids].to(g.dtype)
                g, u = g + gu[..., :n], u + gu[..., n:]
            h = ops.act_mul(g, u, act)
        y = dk.mul_mat_id(dw, h, ids, dt, self.hidden)
        return y if self.down_bias is None else y + self.down_bias[ids].to(y.dtype)


class Weights:
    """The file's tensors by GGUF name, as packed modules and dense tensors on `device`."""

    def __init__(self, reader: GGUFReader, device: torch.device, dtype: torch.dtype, settings: KernelSettings,
                 views: bool = False, products: torch.dtype | None = None):
        self.reader, self.device, self.dtype = reader, device, dtype
        self.settings = settings  # the model's kernel settings, handed to every packed module
        self.products = products  # GgufLinear's `products` for the float matrices
        # vectors as read-only views of the map (for modules that never write into their weights)
        self.views = views and device.type == "cpu" and dtype is torch.float32
        # the native CPU kernels where they are in use (decided once, at load), for the dense matrices
        self.native = settings.cpu if device.type == "cpu" else None
        self._views: dict[str, torch.Tensor] = {}
        self._copied: list[TensorInfo] = []  # tensors repacked into the kernels' own copies
        self.linears: dict[str, GgufLinear | DenseLinear] = {}  # every matrix built, by tensor name (for adapters)

    def has(self, name: str) -> bool:
        return name in self.reader.tensors

    def info(self, name: str) -> TensorInfo:
        try:
            return self.reader.tensors[name]
        except KeyError:
            raise WeightError(f"{self.reader.path}: no tensor {name!r}") from None

    def packed(self, name: str) -> torch.Tensor:
        """The tensor's bytes (zero-copy over the map on CPU), one view per tensor."""
        if name not in self._views:
            view = as_tensor(self.info(name).data)
            self._views[name] = view if self.device.type == "cpu" else view.to(self.device)
        return self._views[name]

    def _expect(self, name: str, shape: tuple[int, ...]) -> TensorInfo:
        info = self.info(name)
        if tuple(info.shape) != tuple(shape):
            raise WeightError(f"{self.reader.path}: tensor {name!r} has shape {tuple(info.shape)}, expected {shape}")
        return info

    def vector(self, name: str, n: int | None = None) -> torch.Tensor:
        """A small dense tensor (norm weight, bias, per-head scalars) in float32."""
        info = self.info(name)
        if n is not None and info.n_elements != n:
            raise WeightError(f"{self.reader.path}: tensor {name!r} has {info.n_elements} values, expected {n}")
        if self.views and info.ggml_type == GGMLType.F32:
            return self.dense(name, tuple(info.shape))
        return torch.from_numpy(info.dequantize().astype("float32").reshape(info.shape)).to(self.device)

    def dense(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """A larger unquantized tensor (a position table, a projection) as it is stored:
        on CPU an F32, F16 or BF16 tensor is a read-only view over the map (no copy, so a
        file's memory stays its size; callers never write into it and take `.float()` of
        what they use); a quantized one is dequantized to float32."""
        info = self._expect(name, shape)
        if self.device.type == "cpu" and info.ggml_type in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
            t = as_tensor(info.array()).reshape(shape)
            return t.view(torch.bfloat16) if info.ggml_type == GGMLType.BF16 else t
        return torch.from_numpy(info.dequantize().astype("float32").reshape(shape)).to(self.device)

    def linear(self, name: str, out_features: int, in_features: int, bias: str | None = None):
        """A packed matrix (out, in); a float32 one stays a dense tensor."""
        info = self.info(name)
        if tuple(info.shape) == (in_features,) and out_features == 1:  # a one-row matrix stored as a vector
            pass
        else:
            self._expect(name, (out_features, in_features))
        b = self.vector(bias, out_features).to(self.dtype) if bias is not None and self.has(bias) else None
        if info.ggml_type == GGMLType.F32:
            w = as_tensor(info.array()).reshape(out_features, in_features)  # zero-copy on CPU
            self.linears[name] = DenseLinear(name, w.to(self.device, self.dtype), b, native=self.native)
            return self.linears[name]
        packed = self.packed(name).reshape(out_features, -1)
        linear = GgufLinear(name, packed, info.ggml_type, in_features, out_features, b, products=self.products,
                            settings=self.settings)
        if linear.repacked:  # the kernels read their own copy: release_copies() unmaps the file's
            self._copied.append(info)
        self.linears[name] = linear
        return linear

    def release_copies(self) -> None:
        """Unmap the file's pages of the tensors the kernels hold their own copies of (so
        memory stays about the file's size); called once the model is built."""
        self.reader.release(self._copied)
        self._copied = []

    def embedding(self, name: str, num: int, dim: int, scale: float | None = None) -> GgufEmbedding:
        info = self._expect(name, (num, dim))
        return GgufEmbedding(name, self.packed(name), info.ggml_type, num, dim, self.dtype, scale,
                             settings=self.settings)

    def experts(self, layer: int, n_experts: int, hidden: int, intermediate: int, biases: bool = False) -> GgufExperts:
        """blk.{layer}'s experts: separate ffn_gate_exps / ffn_up_exps, or fused ffn_gate_up_exps;
        with `biases`, their .bias tensors too."""
        p = f"blk.{layer}."
        down = self._expect(p + "ffn_down_exps.weight", (n_experts, hidden, intermediate))
        if self.has(p + "ffn_gate_up_exps.weight"):
            fused = self._expect(p + "ffn_gate_up_exps.weight", (n_experts, 2 * intermediate, hidden))
            both = self.packed(fused.name)
            gate, up = both[:, :intermediate], both[:, intermediate:]
            types = (fused.ggml_type, fused.ggml_type, down.ggml_type)
        else:
            g = self._expect(p + "ffn_gate_exps.weight", (n_experts, intermediate, hidden))
            u = self._expect(p + "ffn_up_exps.weight", (n_experts, intermediate, hidden))
            gate, up = self.packed(g.name), self.packed(u.name)
            types = (g.ggml_type, u.ggml_type, down.ggml_type)
        b = None
        if biases:
            b = tuple(self.vector(p + f"ffn_{n}_exps.bias", n_experts * size).reshape(n_experts, size)
                      for n, size in (("gate", intermediate), ("up", intermediate), ("down", hidden)))
        is_fused = self.has(p + "ffn_gate_up_exps.weight")
        experts = GgufExperts(f"blk.{layer}.experts", gate, up, self.packed(down.name), types, hidden, intermediate, b,
                              gate_up=both if is_fused else None, settings=self.settings)
        # the kernels read their own copies: the file's pages are unmapped now, layer by layer, so that
        # loading holds at most one layer's experts twice
        infos = [fused, down] if is_fused else [g, u, down]
        self.reader.release([info for info, copied in zip(infos, experts.repacked) if copied])
        return experts
