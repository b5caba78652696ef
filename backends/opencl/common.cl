/* Helpers shared by the programs that reduce in work-groups; placed before
 * their own source when the program is created. Both take a power-of-two
 * work-group size L and leave the result in tmp[0], combined in a fixed
 * order so the same inputs give the same bits on every run. */

/* NAME(tmp) sums tmp of type T; tree_sum over floats, and norm.cl's
 * acc_tree_sum over its chk_acc. */
#define DEFINE_TREE_SUM(NAME, T)                            \
    void NAME(__local T *tmp)                               \
    {                                                       \
        int t = get_local_id(0);                            \
        barrier(CLK_LOCAL_MEM_FENCE);                       \
        for (int h = get_local_size(0) / 2; h > 0; h >>= 1) { \
            if (t < h)                                      \
                tmp[t] += tmp[t + h];                       \
            barrier(CLK_LOCAL_MEM_FENCE);                   \
        }                                                   \
    }

DEFINE_TREE_SUM(tree_sum, float)

void tree_max(__local float *tmp)
{
    int t = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = get_local_size(0) / 2; h > 0; h >>= 1) {
        if (t < h)
            tmp[t] = fmax(tmp[t], tmp[t + h]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

/* A softmax row's statistics, by the whole work-group: *mx the largest of
 * x[0, w) and *sum the sum of exp(x[j] - *mx), the same in every work
 * item. tmp is free again when it returns. */
void row_max_expsum(__global const float *x, int w, __local float *tmp, float *mx, float *sum)
{
    int t = get_local_id(0), step = get_local_size(0);
    float m = -INFINITY;
    for (int j = t; j < w; j += step)
        m = fmax(m, x[j]);
    tmp[t] = m;
    tree_max(tmp);
    m = tmp[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float s = 0.0f;
    for (int j = t; j < w; j += step)
        s += exp(x[j] - m);
    tmp[t] = s;
    tree_sum(tmp);
    *mx = m;
    *sum = tmp[0];
    barrier(CLK_LOCAL_MEM_FENCE);
}
