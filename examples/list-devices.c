/* List the devices Chorus sees: the guide's "check the GPUs". */
#include <chorus.h>
#include <stdio.h>

int main(void)
{
    if (ch_init() != CH_OK) {
        fprintf(stderr, "ch_init: %s\n", ch_last_error());
        return 1;
    }
    for (int i = 0; i < ch_device_count(); i++) {
        ch_device *dev;
        ch_device_info info;
        ch_device_get(&dev, i);
        ch_device_get_info(dev, &info);
        printf("%-10s %-40s %6.1f GiB  %3d compute units%s\n", info.id, info.name,
               (double)info.memory_bytes / (1 << 30), info.compute_units,
               info.in_all ? "" : "  (not in \"all\")");
    }
    ch_shutdown();
    return 0;
}
