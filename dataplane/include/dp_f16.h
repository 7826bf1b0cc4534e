/* dp_f16.h: IEEE half <-> float conversions (GCC/Clang _Float16, F16C where present). */
#ifndef DP_F16_H
#define DP_F16_H

#include <stdint.h>
#include <string.h>

static inline float dp_f16_to_f32(uint16_t bits)
{
	_Float16 h;
	memcpy(&h, &bits, sizeof(h));
	return (float)h;
}

static inline uint16_t dp_f32_to_f16(float f)
{
	_Float16 h = (_Float16)f; /* round to nearest even */
	uint16_t bits;
	memcpy(&bits, &h, sizeof(bits));
	return bits;
}

#endif /* DP_F16_H */
