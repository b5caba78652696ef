/* Chorus: symbol visibility. */
#ifndef CHORUS_EXPORT_H
#define CHORUS_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define CH_API __attribute__((visibility("default")))
#else
#define CH_API
#endif

#endif
