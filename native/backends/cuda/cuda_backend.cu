/* The CUDA (and HIP) backend's table (backend.h): device memory, one stream per instance, a
 * workspace reserved at creation for the instance's limits, and the ops of the other .cu files of
 * this folder. Uploads of host memory are asynchronous copies on the stream; downloads and sync
 * are the only places the host waits. A kernel launch error is remembered (the first one) and
 * reported by the next sync, with the op that launched it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#include "launch.h"
#include "cuda_matmul.h"
#include "error.h"

/* A matmul call held until the backend's next op (see "the matmul's finish" below). The tensors are
 * copied: a caller may pass a view it builds on its stack. */
typedef struct held_matmul {
    int n_mats; /* 0: nothing held */
    specla_tensor w[CUDA_MATMUL_GROUP_LAUNCH];
    const float *x;
    int n_batch;
    float *y[CUDA_MATMUL_GROUP_LAUNCH];
    const char *op;
} held_matmul;

/* The input a matmul may take prequantized ("the fused quantize" below): the output of the last op
 * launched, whose kernel also wrote its Q8_K blocks into the instance's prequantized buffer. */
typedef struct prequantized_input {
    const float *x;   /* NULL: none */
    int64_t elements; /* x's floats, a whole number of 256-blocks read as one flat array */
} prequantized_input;

typedef struct cuda_instance {
    cuda_backend pub;
    int unfinished_matmuls; /* readers given the partial sums (UNFINISHED_*; SPECLA_CUDA_UNFINISHED_MATMUL, default both) */
    held_matmul held;
    void *prequantized; /* device buffer (cuda_matmul_prequantized_bytes); NULL: SPECLA_CUDA_FUSED_QUANTIZE=0 */
    int fused_attention_prepare; /* attention_prepare as one kernel (SPECLA_CUDA_FUSED_ATTENTION_PREPARE, default 1) */
    size_t prequantized_bytes;
    prequantized_input pre;
    cudaError_t first_error;
    const char *first_error_op;
    size_t matmul_workspace_bytes;
    int64_t launches, host_waits, kernels; /* since the last launch_counters call */
    int capturing; /* between capture_begin and capture_end: launches are recorded, not run */
    cudaGraphExec_t steps[STEP_KINDS]; /* recorded steps (capture_end), NULL until recorded */
    int64_t step_kernels[STEP_KINDS];  /* the kernel nodes of each recorded step */
    cudaEvent_t ordering; /* recorded on the stream when another instance waits for it (wait_for) */
} cuda_instance;

static cuda_instance *instance_of(const backend *be) { return (cuda_instance *)be; }

/* the readers that take a matmul's output as its partial sums ("the matmul's finish" below) */
enum { UNFINISHED_RMS = 1, UNFINISHED_SILU = 2 };

/* n kernels launched on the instance's stream: run now, or recorded into a step while capturing */
static void count_launches(cuda_instance *ci, int64_t n) {
    ci->launches += n;
    if (!ci->capturing) ci->kernels += n;
}

extern "C" void cuda_note_launch(const backend *be, const char *op) {
    const cudaError_t err = cudaGetLastError();
    cuda_instance *ci = instance_of(be);
    count_launches(ci, 1);
    if (err != cudaSuccess && ci->first_error == cudaSuccess) {
        ci->first_error = err;
        ci->first_error_op = op;
    }
}

static void note(const backend *be, cudaError_t err, const char *op) {
    cuda_instance *ci = instance_of(be);
    if (err != cudaSuccess && ci->first_error == cudaSuccess) {
        ci->first_error = err;
        ci->first_error_op = op;
    }
}

static cuda_matmul_workspace matmul_ws(const backend *be);
template <class Call> static void matmul_call(const backend *be, const char *op, Call call);

/* ---- the matmul's finish, left to the op that reads the output ---------------------------------
 * A matmul call is launched when the backend's next op comes, not when it is made. If that op can read
 * the output as the split-K partial sums the matmul kernels leave before their finish (add_rms_norm
 * with the matmul's output as delta; silu_mul on the two outputs of a two-matrix group: the residual
 * adds and the SwiGLU of every layer), the matmul runs without its finish
 * (cuda_matmul_group_unfinished) and the op adds the partial sums in chunk order, the finish's own
 * additions (matmul_sums.cuh): the same bits, and each such launch loses its arrival atomics, fences
 * and the finishing warp's round trips, which sit on the step's critical path. Any other op first
 * launches the held matmul as it is; the order of work on the stream never changes. What it gains on
 * the 27B shape, and the bound it is measured against, are in docs/perf.md (twenty-first pass).
 * SPECLA_CUDA_UNFINISHED_MATMUL (cuda_backend_create) picks the readers: 1 both (the default), rms
 * or silu one, 0 none (then nothing is held and every op runs as it is called). */
/* ---- the fused quantize --------------------------------------------------------------------------
 * The ops whose output a layer's Q8_K-block matmuls (Q4_K, Q5_K, Q6_K) read (the wide add_rms_norm and the silu_mul that
 * read partial sums: the residual norms and the SwiGLU; the GDN's gated_rms_norm on heads of 128 and
 * the attention's sigmoid_mul) also write their output's Q8_K blocks into the instance's prequantized
 * buffer (matmul_quantize.cuh: the quantize kernel's own functions, so the same bytes), and the held
 * matmul on that output then skips its quantize kernel (cuda_matmul_group_prequantized): one kernel
 * fewer on the critical path per layer matmul. The blocks stand for the output only until anything
 * else is put on the stream: every op but the matmuls forgets them (after_held, wait_for, the
 * producers themselves before they launch), and so does a matmul that does not take them or whose
 * output overlaps the input they stand for. SPECLA_CUDA_FUSED_QUANTIZE=0 turns it off, for comparisons;
 * the bits are the same either way (tests/test_gpu_model.py compares them). */
static void forget_prequantized(const backend *be) { instance_of(be)->pre.x = NULL; }
/* A producer of `elements` floats at `out` (a matmul input of n_batch rows of n is its n_batch * n
 * floats as flat blocks, whatever shape the producer gives its rows): `launch(q)` runs it with the
 * blocks to fill (codes NULL when the buffer is off or they do not fit) and says whether it filled
 * them; only then do they stand for `out`. */
template <class Launch> static void produce(const backend *be, const float *out, int64_t elements, Launch launch) {
    cuda_instance *ci = instance_of(be);
    forget_prequantized(be);
    if (launch(cuda_matmul_prequantized_blocks(ci->prequantized, ci->prequantized_bytes, elements)))
        ci->pre.x = out, ci->pre.elements = elements;
}

/* Launches the held matmul (if any): with its finish, or with sums non-NULL without it, its outputs'
 * partial sums in sums[] (cuda_matmul_group_unfinished); prequantized when its input is the
 * prequantized output. */
static void launch_held(const backend *be, cuda_matmul_sums *sums = nullptr) {
    cuda_instance *ci = instance_of(be);
    held_matmul &h = ci->held;
    if (h.n_mats == 0) return;
    const specla_tensor *w[CUDA_MATMUL_GROUP_LAUNCH];
    for (int i = 0; i < h.n_mats; i++) w[i] = &h.w[i];
    const int n_mats = h.n_mats;
    h.n_mats = 0;
    const prequantized_input &p = ci->pre;
    const bool pre = p.x && p.x == h.x && h.w[0].ne0 % 256 == 0 && (int64_t)h.n_batch * h.w[0].ne0 == p.elements;
    for (int i = 0; i < n_mats; i++) { /* an output over the input the blocks stand for */
        const float *y = h.y[i], *y_end = y + (int64_t)h.n_batch * h.w[i].ne1;
        if (p.x && y < p.x + p.elements && p.x < y_end) forget_prequantized(be);
    }
    if (!pre) forget_prequantized(be);
    matmul_call(be, h.op, [&] {
        if (pre)
            return cuda_matmul_group_prequantized(cuda_stream(be), n_mats, w, h.x, h.n_batch, h.y, matmul_ws(be), sums,
                                                  ci->prequantized, ci->prequantized_bytes);
        return sums ? cuda_matmul_group_unfinished(cuda_stream(be), n_mats, w, h.x, h.n_batch, h.y, matmul_ws(be), sums)
                    : cuda_matmul_group(cuda_stream(be), n_mats, w, h.x, h.n_batch, h.y, matmul_ws(be));
    });
}
static void hold(const backend *be, const char *op, int n_mats, const specla_tensor *const *w, const float *x,
                 int n_batch, float *const *y) {
    launch_held(be);
    held_matmul &h = instance_of(be)->held;
    for (int i = 0; i < n_mats; i++) h.w[i] = *w[i], h.y[i] = y[i];
    h.x = x, h.n_batch = n_batch, h.op = op, h.n_mats = n_mats;
}

/* The table's other ops: the held matmul is launched before the op itself. */
template <auto Op> struct after_held;
template <class R, class... A, R (*Op)(const backend *, A...)> struct after_held<Op> {
    static R call(const backend *be, A... a) {
        launch_held(be);
        forget_prequantized(be);
        return Op(be, a...);
    }
};

static void destroy(backend *be) {
    cuda_instance *ci = instance_of(be);
    if (!ci) return;
    cudaSetDevice(ci->pub.device);
    for (int i = 0; i < STEP_KINDS; i++)
        if (ci->steps[i]) cudaGraphExecDestroy(ci->steps[i]);
    if (ci->pub.workspace) cudaFree(ci->pub.workspace);
    if (ci->prequantized) cudaFree(ci->prequantized);
    if (ci->ordering) (void)cudaEventDestroy(ci->ordering);
    if (ci->pub.stream) cudaStreamDestroy(ci->pub.stream);
    free(ci);
}

static void *alloc(const backend *be, size_t bytes) {
    void *ptr = NULL;
    if (cudaMalloc(&ptr, bytes > 0 ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is an answer, not a sticky error */
        return NULL;
    }
    if (cudaMemsetAsync(ptr, 0, bytes, cuda_stream(be)) != cudaSuccess) {
        cudaFree(ptr);
        return NULL;
    }
    return ptr;
}
static void release(const backend *be, void *ptr) {
    /* the stream may still use the memory: cudaFree waits for the device to be idle */
    cudaFree(ptr);
}
static void upload(const backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes) note(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_stream(be)), "upload");
}
/* The first error recorded since the last report, as a status (and forgotten). */
static specla_status take_error(const backend *be) {
    cuda_instance *ci = instance_of(be);
    if (ci->first_error == cudaSuccess) return SPECLA_OK;
    const cudaError_t err = ci->first_error;
    const char *op = ci->first_error_op;
    ci->first_error = cudaSuccess;
    return specla_fail(SPECLA_ERR_STATE, "cuda backend (device %d): %s failed: %s", ci->pub.device, op,
                       cudaGetErrorString(err));
}
static specla_status download(const backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes) return take_error(be);
    note(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_stream(be)), "download");
    note(be, cudaStreamSynchronize(cuda_stream(be)), "download");
    instance_of(be)->host_waits++;
    return take_error(be);
}
static void copy(const backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) note(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream(be)), "copy");
}

__global__ void fill_kernel(float *dst, float value, int64_t n) {
    grid_begin();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = value;
}
static void fill(const backend *be, float *dst, float value, int64_t n) {
    if (n <= 0) return;
    const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
    cuda_launch(fill_kernel, dim3((unsigned)blocks), dim3(256), 0, cuda_stream(be), dst, value, n);
    cuda_note_launch(be, "fill");
}

static void launch_counters(const backend *be, int64_t out[3]) {
    cuda_instance *ci = instance_of(be);
    out[0] = ci->launches, out[1] = ci->host_waits, out[2] = ci->kernels;
    ci->launches = ci->host_waits = ci->kernels = 0;
}

static specla_status sync(const backend *be) {
    instance_of(be)->host_waits++;
    note(be, cudaStreamSynchronize(cuda_stream(be)), "sync");
    return take_error(be);
}

/* `other`'s event marks everything issued on its stream so far; be's stream waits for it on the
 * device. */
static void wait_for(const backend *be, const backend *other) {
    launch_held(be);
    launch_held(other); /* `everything issued on other's stream so far` includes its held matmul */
    forget_prequantized(be);
    forget_prequantized(other);
    cuda_instance *oi = instance_of(other);
    note(be, cudaEventRecord(oi->ordering, cuda_stream(other)), "wait_for");
    note(be, cudaStreamWaitEvent(cuda_stream(be), oi->ordering, 0), "wait_for");
}

/* ---- recorded steps -------------------------------------------------------------------------- */
/* Relaxed capture: the matmul asks the device's attributes while it is recorded; no op of a step
 * allocates, synchronises or copies to the host. */
static void capture_begin(const backend *be) {
    note(be, cudaStreamBeginCapture(cuda_stream(be), cudaStreamCaptureModeRelaxed), "capture_begin");
    instance_of(be)->capturing = 1;
}

/* The kernel nodes of a recorded step: what one replay runs (CUDA's own count of the recording,
 * against which a test checks the launches counted op by op). */
static int64_t kernel_nodes(cudaGraph_t graph) {
    size_t n = 0;
    if (cudaGraphGetNodes(graph, NULL, &n) != cudaSuccess || n == 0) return 0;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(n * sizeof *nodes);
    int64_t kernels = 0;
    if (nodes && cudaGraphGetNodes(graph, nodes, &n) == cudaSuccess) {
        for (size_t i = 0; i < n; i++) {
            cudaGraphNodeType type;
            if (cudaGraphNodeGetType(nodes[i], &type) == cudaSuccess && type == cudaGraphNodeTypeKernel) kernels++;
        }
    }
    free(nodes);
    return kernels;
}

static specla_status capture_end(const backend *be, int key) {
    cuda_instance *ci = instance_of(be);
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(cuda_stream(be), &graph);
    ci->capturing = 0;
    if (err == cudaSuccess && ci->first_error != cudaSuccess) err = ci->first_error;
    if (err == cudaSuccess) {
        if (ci->steps[key]) cudaGraphExecDestroy(ci->steps[key]);
        ci->steps[key] = NULL;
        ci->step_kernels[key] = kernel_nodes(graph);
        err = cudaGraphInstantiate(&ci->steps[key], graph, 0);
    }
    if (graph) cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
        ci->steps[key] = NULL;
        ci->first_error = cudaSuccess;
        (void)cudaGetLastError();
        return specla_fail(SPECLA_ERR_STATE, "cuda backend: recording step %d failed: %s", key, cudaGetErrorString(err));
    }
    return SPECLA_OK;
}

static int replay(const backend *be, int key) {
    cuda_instance *ci = instance_of(be);
    if (!ci->steps[key]) return 0;
    note(be, cudaGraphLaunch(ci->steps[key], cuda_stream(be)), "replay");
    ci->launches++;
    ci->kernels += ci->step_kernels[key];
    return 1;
}

/* ---- weights -------------------------------------------------------------------------------- */
static size_t weight_bytes(const backend *be, const specla_tensor *host, int use) {
    if (use == WEIGHT_MATMUL) return cuda_matmul_prepared_bytes(host->type, host->ne0, host->ne1);
    return (size_t)host->nbytes;
}
static specla_status upload_weight(const backend *be, const specla_tensor *host, void *dst, int use) {
    const cudaError_t err = use == WEIGHT_MATMUL
                                ? cuda_matmul_prepare_weight(host, dst)
                                : cudaMemcpy(dst, host->data, (size_t)host->nbytes, cudaMemcpyHostToDevice);
    if (err != cudaSuccess)
        return specla_fail(SPECLA_ERR_STATE, "cuda backend: weight upload failed: %s", cudaGetErrorString(err));
    return SPECLA_OK;
}

/* A call into matmul.cu, which launches its own kernels (a quantize or split kernel and one per
 * weight type; a row gather): its error noted and its kernels counted like every other kernel. */
template <class Call> static void matmul_call(const backend *be, const char *op, Call call) {
    const int64_t before = cuda_matmul_kernel_launches();
    note(be, call(), op);
    count_launches(instance_of(be), cuda_matmul_kernel_launches() - before);
}

/* A reduced LM head: the rows move inside the prepared layout (cuda_matmul_gather_rows). */
static void gather_weight_rows(const backend *be, const specla_tensor *w, const int32_t *ids, int n, void *dst,
                               int first) {
    if (n <= 0) return;
    matmul_call(be, "gather_weight_rows", [&] { return cuda_matmul_gather_rows(cuda_stream(be), w, ids, n, dst, first); });
}

/* the tree kernels do not count their work on the device yet */
static void tree_counters(const backend *be, int64_t out[2]) { out[0] = out[1] = -1; }

/* ---- matmul ----------------------------------------------------------------------------------- */
static cuda_matmul_workspace matmul_ws(const backend *be) {
    const cuda_matmul_workspace ws = {cuda_of(be)->workspace, instance_of(be)->matmul_workspace_bytes};
    return ws;
}
static void matmul(const backend *be, const specla_tensor *w, const float *x, int n_batch, float *y) {
    if (instance_of(be)->unfinished_matmuls) {
        hold(be, "matmul", 1, &w, x, n_batch, &y);
        return;
    }
    forget_prequantized(be); /* nothing is prequantized without the readers of partial sums */
    matmul_call(be, "matmul", [&] { return cuda_matmul(cuda_stream(be), w, x, n_batch, y, matmul_ws(be)); });
}
static void matmul_group(const backend *be, int n_mats, const specla_tensor *const *w, const float *x, int n_batch,
                         float *const *y) {
    if (instance_of(be)->unfinished_matmuls && n_mats <= CUDA_MATMUL_GROUP_LAUNCH) {
        hold(be, "matmul_group", n_mats, w, x, n_batch, y);
        return;
    }
    launch_held(be);
    forget_prequantized(be);
    matmul_call(be, "matmul_group",
                [&] { return cuda_matmul_group(cuda_stream(be), n_mats, w, x, n_batch, y, matmul_ws(be)); });
}

/* the readers of held outputs (see "the matmul's finish" above) */
static void add_rms_norm(const backend *be, float *x, const float *delta, const float *weight, int n_rows, int n,
                         float eps, float *y) {
    const held_matmul &h = instance_of(be)->held;
    if ((instance_of(be)->unfinished_matmuls & UNFINISHED_RMS) && h.n_mats == 1 && h.y[0] == delta &&
        h.n_batch == n_rows && h.w[0].ne1 == n && cuda_add_rms_norm_reads_sums(x, delta, weight, y, n)) {
        cuda_matmul_sums sums[1];
        launch_held(be, sums);
        produce(be, y, (int64_t)n_rows * n, [&](cuda_matmul_q8k q) {
            return cuda_add_rms_norm_sums(be, x, const_cast<float *>(delta), sums[0], weight, n_rows, n, eps, y, q);
        });
        return;
    }
    launch_held(be);
    forget_prequantized(be);
    cuda_add_rms_norm(be, x, delta, weight, n_rows, n, eps, y);
}
static void silu_mul(const backend *be, float *a, const float *b, int64_t n) {
    const held_matmul &h = instance_of(be)->held;
    if ((instance_of(be)->unfinished_matmuls & UNFINISHED_SILU) && h.n_mats == 2 && h.y[0] == a && h.y[1] == b &&
        h.w[0].ne1 == h.w[1].ne1 &&
        (int64_t)h.n_batch * h.w[0].ne1 == n) {
        const int width = (int)h.w[0].ne1;
        cuda_matmul_sums sums[2];
        launch_held(be, sums);
        produce(be, a, n, [&](cuda_matmul_q8k q) {
            return cuda_silu_mul_sums(be, a, const_cast<float *>(b), sums[0], sums[1], n, width, q);
        });
        return;
    }
    launch_held(be);
    forget_prequantized(be);
    cuda_silu_mul(be, a, b, n);
}
static void sigmoid_mul(const backend *be, float *x, const float *gate, int64_t n) {
    launch_held(be);
    produce(be, x, n, [&](cuda_matmul_q8k q) { return cuda_sigmoid_mul(be, x, gate, n, q); });
}
static void gated_rms_norm(const backend *be, float *x, const float *weight, const float *gate, int n_rows, int n,
                           float eps) {
    launch_held(be);
    produce(be, x, (int64_t)n_rows * n,
            [&](cuda_matmul_q8k q) { return cuda_gated_rms_norm(be, x, weight, gate, n_rows, n, eps, q); });
}
/* One kernel where cuda_attention_prepare takes the shape (and SPECLA_CUDA_FUSED_ATTENTION_PREPARE is not
 * 0), else the ops it stands for; the same bits either way (tests/test_gpu_model.py compares them). */
static void attention_prepare(const backend *be, const float *qg, float *q, float *gate, float *k, const float *v,
                              const float *q_norm, const float *k_norm, float eps, const int32_t *positions,
                              int n_rot, float freq_base, const int32_t *rows, int T, int nh, int nkv, int D,
                              float *k_cache, float *v_cache) {
    if (instance_of(be)->fused_attention_prepare &&
        cuda_attention_prepare(be, qg, q, gate, k, v, q_norm, k_norm, eps, positions, n_rot, freq_base, rows, T, nh,
                               nkv, D, k_cache, v_cache))
        return;
    attention_prepare_by_ops(be, qg, q, gate, k, v, q_norm, k_norm, eps, positions, n_rot, freq_base, rows, T, nh, nkv,
                             D, k_cache, v_cache);
}
static void quantize_activations(const backend *be, int32_t weight_type, const float *x, int n_rows, int n,
                                 int8_t *codes, float *scales) {
    /* the bsums of 256-blocks go to the workspace: the single op reports codes and scales only */
    matmul_call(be, "quantize_activations", [&] {
        return cuda_matmul_quantize_activations(cuda_stream(be), weight_type, x, n_rows, n, codes, scales,
                                                (int16_t *)cuda_of(be)->workspace);
    });
}

static const backend_ops cuda_ops_table = {
    /* name */ "cuda",
    /* host_memory */ 0,
    /* destroy */ destroy,
    /* alloc */ after_held<alloc>::call,
    /* free */ after_held<release>::call,
    /* upload */ after_held<upload>::call,
    /* download */ after_held<download>::call,
    /* copy */ after_held<copy>::call,
    /* fill */ after_held<fill>::call,
    /* sync */ after_held<sync>::call,
    /* wait_for */ wait_for,
    /* capture_begin */ after_held<capture_begin>::call,
    /* capture_end */ after_held<capture_end>::call,
    /* replay */ after_held<replay>::call,
    /* launch_counters */ after_held<launch_counters>::call,
    /* weight_bytes */ after_held<weight_bytes>::call,
    /* upload_weight */ after_held<upload_weight>::call,
    /* gather_weight_rows */ after_held<gather_weight_rows>::call,
    /* matmul */ matmul,
    /* matmul_group */ matmul_group,
    /* get_rows */ after_held<cuda_get_rows>::call,
    /* dequantize */ after_held<cuda_dequantize>::call,
    /* quantize_activations */ after_held<quantize_activations>::call,
    /* rms_norm */ after_held<cuda_rms_norm>::call,
    /* add_rms_norm */ add_rms_norm,
    /* l2_norm */ after_held<cuda_l2_norm>::call,
    /* add */ after_held<cuda_add>::call,
    /* add_bias_rows */ after_held<cuda_add_bias_rows>::call,
    /* silu_mul */ silu_mul,
    /* sigmoid_mul */ sigmoid_mul,
    /* gdn_gates */ after_held<cuda_gdn_gates>::call,
    /* gdn_split_qkv */ after_held<cuda_gdn_split_qkv>::call,
    /* gdn_prepare */ after_held<cuda_gdn_prepare>::call,
    /* gated_rms_norm */ gated_rms_norm,
    /* split_q_gate */ after_held<cuda_split_q_gate>::call,
    /* rope_neox */ after_held<cuda_rope_neox>::call,
    /* attention_prepare */ after_held<attention_prepare>::call,
    /* scatter_rows */ after_held<cuda_scatter_rows>::call,
    /* move_rows */ after_held<cuda_move_rows>::call,
    /* gather_rows */ after_held<cuda_gather_rows>::call,
    /* attention */ after_held<cuda_attention>::call,
    /* attention_tree */ after_held<cuda_attention_tree>::call,
    /* causal_conv */ after_held<cuda_causal_conv>::call,
    /* gated_delta_rule */ after_held<cuda_gated_delta_rule>::call,
    /* gdn_tree_chains */ after_held<cuda_gdn_tree_chains>::call,
    /* gdn_tree_root_to_leaf */ after_held<cuda_gdn_tree_root_to_leaf>::call,
    /* gdn_tree_checkpoints */ after_held<cuda_gdn_tree_checkpoints>::call,
    /* gdn_fold */ after_held<cuda_gdn_fold>::call,
    /* conv_tree */ after_held<cuda_conv_tree>::call,
    /* conv_fold */ after_held<cuda_conv_fold>::call,
    /* tree_counters */ after_held<tree_counters>::call,
    /* argmax_rows */ after_held<cuda_argmax_rows>::call,
    /* topk_log_softmax */ after_held<cuda_topk_log_softmax>::call,
};

/* A backend setting from the environment that names one of n choices: *value becomes values[i]
 * for names[i] (left as it is when unset or empty); any other value fails, naming the setting and
 * its choices as `choices` words them. */
static specla_status read_choice(const char *name, int n, const char *const *names, const int *values,
                                 const char *choices, int *value) {
    const char *s = getenv(name);
    if (!s || !*s) return SPECLA_OK;
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) {
            *value = values[i];
            return SPECLA_OK;
        }
    return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "backend cuda: %s must be %s, got '%s'", name, choices, s);
}

/* An on/off backend switch from the environment into *value (left as it is when unset or empty);
 * any value but 0 or 1 fails, naming the switch. */
static specla_status read_switch(const char *name, int *value) {
    static const char *const names[] = {"0", "1"};
    static const int values[] = {0, 1};
    return read_choice(name, 2, names, values, "0 (off) or 1 (on)", value);
}

extern "C" specla_status cuda_backend_create(int device, const backend_limits *limits, backend **out) {
    *out = NULL;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return specla_fail(SPECLA_ERR_UNSUPPORTED, "backend cuda: no CUDA device on this machine");
    }
    if (limits->gdn_head_size > 128 * 128)
        return specla_fail(SPECLA_ERR_UNSUPPORTED,
                           "backend cuda: recurrent state size S = %d > 128 (the GDN kernels keep a head's rows in "
                           "registers up to S = 128)",
                           (int)(limits->gdn_head_size > 0 ? __builtin_sqrt((double)limits->gdn_head_size) : 0));
    if (device < 0 || device >= count)
        return specla_fail(SPECLA_ERR_INVALID_ARGUMENT, "backend cuda: device %d, this machine has %d (0 .. %d)", device,
                           count, count - 1);
    if (cudaSetDevice(device) != cudaSuccess)
        return specla_fail(SPECLA_ERR_STATE, "backend cuda: cannot use device %d: %s", device,
                           cudaGetErrorString(cudaGetLastError()));
    /* SPECLA_CUDA_TENSOR_CORES=0|1|2 sets cuda_matmul_set_tensor_cores for the process (default 1), for
     * comparisons: the 8-bit types' bits are the same in every mode, F16/BF16 weights run the fma
     * path with 0 and the f16/bf16 tensor-core kernel otherwise (another order: other bits). */
    {
        static const char *const names[] = {"0", "1", "2"};
        static const int values[] = {CUDA_MATMUL_TC_OFF, CUDA_MATMUL_TC_STAGED, CUDA_MATMUL_TC_PER_WARP};
        int mode = -1;
        if (read_choice("SPECLA_CUDA_TENSOR_CORES", 3, names, values, "0 (off), 1 (staged) or 2 (per-warp)", &mode) !=
            SPECLA_OK)
            return SPECLA_ERR_INVALID_ARGUMENT;
        if (mode >= 0) cuda_matmul_set_tensor_cores(mode);
    }
    /* SPECLA_CUDA_PAIR_LAUNCH=1 (both, the default), decode, batch or 0 (none) sets
     * cuda_matmul_set_pair_launch for the process: a group's Q4_K and Q6_K matrices in one launch
     * (one-token calls, staged 2..64-token calls); the bits are the same in every setting. */
    {
        static const char *const names[] = {"1", "decode", "batch", "0"};
        static const int values[] = {CUDA_MATMUL_PAIR_DECODE | CUDA_MATMUL_PAIR_BATCH, CUDA_MATMUL_PAIR_DECODE,
                                     CUDA_MATMUL_PAIR_BATCH, 0};
        int forms = -1;
        if (read_choice("SPECLA_CUDA_PAIR_LAUNCH", 4, names, values,
                        "0 (off), 1 (both), decode (one-token calls) or batch (staged batches)", &forms) != SPECLA_OK)
            return SPECLA_ERR_INVALID_ARGUMENT;
        if (forms >= 0) cuda_matmul_set_pair_launch(forms);
    }
    cuda_instance *ci = (cuda_instance *)calloc(1, sizeof *ci);
    if (!ci) return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "backend cuda: out of memory");
    /* SPECLA_CUDA_UNFINISHED_MATMUL=1 (both, the default), rms, silu or 0 (none): the readers that
     * take a matmul's finish over (above), the residual adds' add_rms_norm and the SwiGLU's silu_mul.
     * The bits are the same in every setting (tests/test_gpu_model.py compares them); the other
     * settings are there for comparisons. */
    ci->unfinished_matmuls = UNFINISHED_RMS | UNFINISHED_SILU;
    {
        static const char *const names[] = {"1", "rms", "silu", "0"};
        static const int values[] = {UNFINISHED_RMS | UNFINISHED_SILU, UNFINISHED_RMS, UNFINISHED_SILU, 0};
        if (read_choice("SPECLA_CUDA_UNFINISHED_MATMUL", 4, names, values,
                        "0 (off), 1 (both readers), rms (add_rms_norm) or silu (silu_mul)",
                        &ci->unfinished_matmuls) != SPECLA_OK) {
            free(ci);
            return SPECLA_ERR_INVALID_ARGUMENT;
        }
    }
    /* SPECLA_CUDA_FUSED_QUANTIZE=0 turns the fused quantize ("the fused quantize" above) off;
     * SPECLA_CUDA_FUSED_ATTENTION_PREPARE=0 runs attention_prepare as the ops it stands for instead of
     * one kernel. 1 (the default) turns either on; the bits are the same either way. */
    int fused_quantize = 1;
    ci->fused_attention_prepare = 1;
    /* SPECLA_CUDA_ATTENTION_TC=1: the attention's scores and weighted V sums in 3xTF32 on the tensor
     * cores (another arithmetic: other bits than the fp32 path, the same identities between calls).
     * Off by default: slower at short depth, faster only for batches deep in the context, and less
     * accurate than the fp32 path's bound (docs/perf.md, twenty-ninth pass).
     * SPECLA_CUDA_GDN_DEFER=0: the GDN walk without its deferred step (the same bits; on by default).
     * SPECLA_CUDA_RECORDED_BATCHES=0: causal batches launched kernel by kernel instead of recorded
     * and replayed as the decode and verify steps are (docs/gpu-steps.md; the same bits; on by
     * default: a replay saves an eager batch's launch costs).
     * SPECLA_CUDA_ATTENTION_DECODE_GENERAL=1: a decode step's attention kernel without its compiled
     * 27B pair shape (attention.cu; the same bits); off: slower once a decode block has long segments
     * to walk (docs/perf.md, thirty-second pass).
     * SPECLA_CUDA_ATTENTION_BLOCKED=0: a batch's shared attention segments on the tile kernel's own
     * walk instead of attention_blocked_kernel's (attention.cu; the same bits; on by default where an
     * SM holds two of its blocks). */
    ci->pub.gdn_deferred_steps = 1;
    ci->pub.attention_blocked = 1;
    ci->pub.base.records_batches = 1;
    if (read_switch("SPECLA_CUDA_FUSED_QUANTIZE", &fused_quantize) != SPECLA_OK ||
        read_switch("SPECLA_CUDA_FUSED_ATTENTION_PREPARE", &ci->fused_attention_prepare) != SPECLA_OK ||
        read_switch("SPECLA_CUDA_ATTENTION_TC", &ci->pub.attention_tensor_cores) != SPECLA_OK ||
        read_switch("SPECLA_CUDA_GDN_DEFER", &ci->pub.gdn_deferred_steps) != SPECLA_OK ||
        read_switch("SPECLA_CUDA_RECORDED_BATCHES", &ci->pub.base.records_batches) != SPECLA_OK ||
        read_switch("SPECLA_CUDA_ATTENTION_DECODE_GENERAL", &ci->pub.attention_decode_general) != SPECLA_OK ||
        read_switch("SPECLA_CUDA_ATTENTION_BLOCKED", &ci->pub.attention_blocked) != SPECLA_OK) {
        free(ci);
        return SPECLA_ERR_INVALID_ARGUMENT;
    }
    ci->pub.base.ops = &cuda_ops_table;
    ci->pub.base.state = ci;
    ci->pub.base.kind = SPECLA_BACKEND_CUDA;
    ci->pub.base.device = device;
    ci->pub.device = device;
    ci->pub.limits = *limits;
    cudaDeviceGetAttribute(&ci->pub.sm_count, cudaDevAttrMultiProcessorCount, device);
    /* left 0 (unknown) where the query fails: recurrent.cu then budgets a fixed 48 KiB per block */
    (void)cudaDeviceGetAttribute(&ci->pub.shared_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
    /* SPECLA_CUDA_PDL=0 turns off the programmatic dependent launches of every kernel (launch.h: on
     * by default on sm_90+), for comparisons; the bits are the same either way. */
    const char *pdl = getenv("SPECLA_CUDA_PDL");
    if (pdl && *pdl) cuda_set_launch_overlap(pdl[0] == '1');
    if (cudaStreamCreateWithFlags(&ci->pub.stream, cudaStreamNonBlocking) != cudaSuccess) {
        free(ci);
        return specla_fail(SPECLA_ERR_STATE, "backend cuda: cannot create a stream on device %d", device);
    }
    if (cudaEventCreateWithFlags(&ci->ordering, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaStreamDestroy(ci->pub.stream);
        free(ci);
        return specla_fail(SPECLA_ERR_STATE, "backend cuda: cannot create an event on device %d", device);
    }
    /* one workspace that the op families take turns in (none keeps data there between calls) */
    size_t bytes = cuda_matmul_workspace_bytes(limits->max_rows, limits->max_width);
    const size_t others[4] = {cuda_attention_workspace_bytes(limits), cuda_logits_workspace_bytes(limits),
                              cuda_recurrent_workspace_bytes(limits),
                              sizeof(int16_t) * (size_t)limits->max_rows * (size_t)(limits->max_width / 16 + 1)};
    for (int i = 0; i < 4; i++) bytes = others[i] > bytes ? others[i] : bytes;
    ci->matmul_workspace_bytes = bytes;
    ci->pub.workspace_bytes = bytes;
    if (cudaMalloc(&ci->pub.workspace, ci->pub.workspace_bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaEventDestroy(ci->ordering);
        cudaStreamDestroy(ci->pub.stream);
        free(ci);
        return specla_fail(SPECLA_ERR_OUT_OF_MEMORY, "backend cuda: out of device memory for a %.1f MB workspace",
                           (double)bytes / 1e6);
    }
    /* the prequantized activations: inputs of up to max_rows x max_width floats, zeroed once for the
     * split-K counters they carry */
    const size_t pre_bytes =
        fused_quantize ? cuda_matmul_prequantized_bytes((int64_t)limits->max_rows * limits->max_width) : 0;
    if (pre_bytes) {
        if (cudaMalloc(&ci->prequantized, pre_bytes) != cudaSuccess ||
            cudaMemset(ci->prequantized, 0, pre_bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            if (ci->prequantized) cudaFree(ci->prequantized);
            cudaFree(ci->pub.workspace);
            (void)cudaEventDestroy(ci->ordering);
            cudaStreamDestroy(ci->pub.stream);
            free(ci);
            return specla_fail(SPECLA_ERR_OUT_OF_MEMORY,
                               "backend cuda: out of device memory for %.1f MB of prequantized activations",
                               (double)pre_bytes / 1e6);
        }
        ci->prequantized_bytes = pre_bytes;
    }
    *out = &ci->pub.base;
    return SPECLA_OK;
}
