/* Helpers shared by the programs that reduce in work-groups; placed before
 * their own source when the program is created. Both take a power-of-two
 * work-group size L and leave the result in tmp[0], combined in a fixed
 * order so the same inputs give the same bits on every run. */

void tree_sum(__local float *tmp)
{
    int t = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = get_local_size(0) / 2; h > 0; h >>= 1) {
        if (t < h)
            tmp[t] += tmp[t + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

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
