/* GPT sampling for chorus-train's --generate (utils/sample.c). */
#ifndef CHORUS_TRAIN_SAMPLE_H
#define CHORUS_TRAIN_SAMPLE_H

#include <chorus.h>

#include "train-options.h"

/* --generate N: N tokens continuing --prompt, drawn from model m (a GPT
 * of shape o->gpt, switched to evaluation mode while it samples) with
 * --temperature, --top-k and --seed, printed on stdout after "sample:"
 * as they come: as text when the tokens are `bytes`, else as numbers. */
ch_status sample_generate(ch_module *m, const train_options *o, int bytes);

#endif
