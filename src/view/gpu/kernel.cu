// prepfs fused render kernel: decoded uint8 HWC -> a view's output, many images per launch.
//
// A line-for-line translation of `view::fused::mirror` (Rust), which is tested byte for byte
// against the CPU renderer; change both or neither. Integer filter arithmetic as
// fast_image_resize's u8 bilinear convolution (vertical pass first, u8 intermediate), floats as
// v * scale + offset with one rounding per operation (__fmul_rn/__fadd_rn: no FMA contraction).
// One thread per output pixel (all three channels); grid.y indexes the batch's items.

struct Item {
    unsigned long long src;
    unsigned long long dst;
    int src_w, src_h;
    int reg_l, reg_t;
    int res_w, res_h;
    int win_l, win_t;
    int out_w, out_h;
    int valid[4];
    int xtaps, xwin, xprec;
    int ytaps, ywin, yprec;
    int flip, layout;
    float scale[3];
    float offset[3];
};

// The size of `view::fused::Item` (its test checks the field offsets on the Rust side; C lays
// out these fields in the same order with no padding).
static_assert(sizeof(Item) == 128, "struct Item must be 128 bytes");

#define LAYOUT_F32_CHW 0
#define LAYOUT_U8_CHW 1

__device__ __forceinline__ unsigned char clip8(int v, int precision) {
    int s = v >> precision;
    return (unsigned char)(s < 0 ? 0 : (s > 255 ? 255 : s));
}

__device__ __forceinline__ unsigned char vertical(const Item& it, const int* taps,
                                                  const unsigned char* src, int gy, int sx, int c) {
    const size_t stride = (size_t)it.src_w * 3;
    const size_t base = it.src + (size_t)(it.reg_l + sx) * 3 + c;
    if (it.ytaps < 0) {
        return src[base + (size_t)(it.reg_t + gy) * stride];
    }
    const int bound = it.ytaps + 2 * gy;
    const int start = taps[bound], count = taps[bound + 1];
    const int* w = taps + it.ytaps + 2 * it.res_h + gy * it.ywin;
    int sum = 1 << (it.yprec - 1);
    for (int i = 0; i < count; ++i) {
        const size_t row = (size_t)(it.reg_t + start + i);
        sum += (int)src[base + row * stride] * w[i];
    }
    return clip8(sum, it.yprec);
}

__device__ __forceinline__ unsigned char sample(const Item& it, const int* taps,
                                                const unsigned char* src, int gx, int gy, int c) {
    if (it.xtaps < 0) {
        return vertical(it, taps, src, gy, gx, c);
    }
    const int bound = it.xtaps + 2 * gx;
    const int start = taps[bound], count = taps[bound + 1];
    const int* w = taps + it.xtaps + 2 * it.res_w + gx * it.xwin;
    int sum = 1 << (it.xprec - 1);
    for (int j = 0; j < count; ++j) {
        const unsigned char v = vertical(it, taps, src, gy, start + j, c);
        sum += (int)v * w[j];
    }
    return clip8(sum, it.xprec);
}

extern "C" __global__ void render_batch(const Item* items, int n_items, const int* taps,
                                        const unsigned char* src, unsigned char* dst) {
    const int item = blockIdx.y;
    if (item >= n_items) return;
    const Item it = items[item];
    const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long plane = (long long)it.out_w * it.out_h;
    if (p >= plane) return;
    const int y = (int)(p / it.out_w), x = (int)(p % it.out_w);
    const int sx = it.flip ? it.out_w - 1 - x : x;
    const int gx = it.win_l + sx, gy = it.win_t + y;
    const bool inside = gx >= it.valid[0] && gy >= it.valid[1] && gx < it.valid[2] && gy < it.valid[3];
    for (int c = 0; c < 3; ++c) {
        const unsigned char v = inside ? sample(it, taps, src, gx, gy, c) : 0;
        if (it.layout == LAYOUT_F32_CHW) {
            const float f = __fadd_rn(__fmul_rn((float)v, it.scale[c]), it.offset[c]);
            float* out = (float*)(dst + it.dst);
            out[c * plane + p] = f;
        } else if (it.layout == LAYOUT_U8_CHW) {
            dst[it.dst + c * plane + p] = v;
        } else {
            dst[it.dst + p * 3 + c] = v;
        }
    }
}
