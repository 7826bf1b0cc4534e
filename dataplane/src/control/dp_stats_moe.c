/* dp_stats_moe.c: the stats segment's MoE region, each MoE layer's expert and duck load
 * (dp_stats_moe.h; the layout and its reading rules are drawn in duckpipe/schema/stats.py).
 *
 * A slot per layer, taken by the layer's first routed forward: running totals, added at
 * each completion from the forward's own data (its checked host table, each duck's routed
 * entries as its NIC's worker sent them, so rows routed around a lost duck count where
 * they went), and the last recent window, the totals' growth over about
 * STATS_MOE_WINDOW_NS, rewritten at the first tick past each window between two stores of
 * the slot's seq. The window costs nothing per forward: the agent keeps the totals of the
 * window's start and subtracts.
 */
#include "dp_stats_moe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "dp_expert_load.h"
#include "dp_fwd.h"
#include "dp_layers.h"

/* What the control agent keeps of a slot: the totals at the window's start (the window's
 * counts are the growth since), and the layer object whose placement the slot shows. */
struct moe_slot_mem {
	const struct dp_layer *layer;
	uint64_t forwards;
	uint64_t tokens;
	uint64_t expert[DP_MAX_EXPERTS];
	uint64_t duck[DP_MAX_DUCKS];
	bool busy;  /* a forward was counted in this window */
	bool shown; /* the last window's counts are not all 0 */
};

struct dp_stats_moe_seg {
	struct dp_stats_moe *head;
	struct dp_stats_moe_layer *slots;
	uint64_t window_start;
	/* each slot's layer id and state as the segment has them, side by side: a forward's
	 * lookup reads these two lines, not a line of each slot 32 KiB apart */
	uint32_t slot_layer[DP_STATS_MOE_LAYERS];
	uint32_t slot_state[DP_STATS_MOE_LAYERS];
	uint64_t scratch[DP_MAX_EXPERTS]; /* an untracked layer's counts, thrown away */
	struct moe_slot_mem mem[DP_STATS_MOE_LAYERS];
};

_Static_assert(DP_STATS_MOE_LAYERS <= 1024, "slot lookup is a scan per routed forward");

static void add64(uint64_t *p, uint64_t n)
{
	dp_store_relaxed_u64(p, *p + n);
}

/* Stores between seq_begin and seq_end are release stores: none is seen before the odd
 * seq (a reader that copies across them retries). On x86 they are plain stores. */
static void put64(uint64_t *p, uint64_t v)
{
	dp_store_release_u64(p, v);
}

static void put32(uint32_t *p, uint32_t v)
{
	dp_store_release_u32(p, v);
}

static void seq_begin(struct dp_stats_moe_layer *s)
{
	put32(&s->seq, s->seq | 1); /* odd: being written */
}

static void seq_end(struct dp_stats_moe_layer *s)
{
	put32(&s->seq, s->seq + 1); /* the next even value */
}

static void set_state(struct dp_stats_moe_seg *m, uint32_t i, uint32_t state)
{
	put32(&m->slots[i].state, state);
	m->slot_state[i] = state;
}

static uint32_t clamp32(uint64_t v)
{
	return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

static uint32_t n_experts_of(const struct dp_routing_placement *pl)
{
	return pl->n_experts < DP_MAX_EXPERTS ? pl->n_experts : DP_MAX_EXPERTS;
}

static bool same_placement(const struct dp_stats_moe_layer *s, const struct dp_routing_placement *pl)
{
	uint32_t n = n_experts_of(pl);
	return s->n_experts == n && !memcmp(s->replicas, pl->replicas, n) &&
	       !memcmp(s->ducks, pl->ducks, (size_t)n * DP_MAX_REPLICAS * sizeof(s->ducks[0]));
}

/* Inside a seq section. */
static void copy_placement(struct dp_stats_moe_layer *s, const struct dp_routing_placement *pl)
{
	uint32_t n = n_experts_of(pl);
	memcpy(s->replicas, pl->replicas, n);
	memset(s->replicas + n, 0, DP_MAX_EXPERTS - n);
	memcpy(s->ducks, pl->ducks, (size_t)n * DP_MAX_REPLICAS * sizeof(s->ducks[0]));
	memset(s->ducks + (size_t)n * DP_MAX_REPLICAS, 0,
	       (size_t)(DP_MAX_EXPERTS - n) * DP_MAX_REPLICAS * sizeof(s->ducks[0]));
}

/* Slot i starts over for layer l: counts zero, its placement. */
static void take_slot(struct dp_stats_moe_seg *m, uint32_t i, const struct dp_layer *l)
{
	struct dp_stats_moe_layer *s = &m->slots[i];
	seq_begin(s);
	memset((uint8_t *)s + offsetof(struct dp_stats_moe_layer, forwards), 0,
	       sizeof(*s) - offsetof(struct dp_stats_moe_layer, forwards));
	put32(&s->layer, l->id);
	m->slot_layer[i] = l->id;
	put32(&s->n_experts, n_experts_of(&l->moe->pl));
	copy_placement(s, &l->moe->pl);
	set_state(m, i, DP_MOE_LAYER_STATE_LOADED);
	seq_end(s);
	memset(&m->mem[i], 0, sizeof(m->mem[i]));
	m->mem[i].layer = l;
}

/* Slot i's layer was loaded again under its id (a new placement, say): the counts go on. */
static void reload_slot(struct dp_stats_moe_seg *m, uint32_t i, const struct dp_layer *l)
{
	struct dp_stats_moe_layer *s = &m->slots[i];
	seq_begin(s);
	if (!same_placement(s, &l->moe->pl))
		copy_placement(s, &l->moe->pl);
	set_state(m, i, DP_MOE_LAYER_STATE_LOADED);
	seq_end(s);
	m->mem[i].layer = l;
}

/* The slot of layer l: its own, or a free one, or one of a layer unloaded since (its
 * counts are lost then); -1 when every slot holds a loaded layer. */
static int slot_of(struct dp_stats_moe_seg *m, const struct dp_layer *l)
{
	int free_at = -1, gone_at = -1;
	for (uint32_t i = 0; i < DP_STATS_MOE_LAYERS; i++) {
		uint32_t state = m->slot_state[i];
		if (state == DP_MOE_LAYER_STATE_FREE) {
			free_at = free_at < 0 ? (int)i : free_at;
			continue;
		}
		if (m->slot_layer[i] == l->id) {
			if (m->slots[i].n_experts != n_experts_of(&l->moe->pl))
				take_slot(m, i, l); /* another layer under that id */
			else if (m->mem[i].layer != l || state != DP_MOE_LAYER_STATE_LOADED)
				reload_slot(m, i, l);
			return (int)i;
		}
		if (state == DP_MOE_LAYER_STATE_GONE && gone_at < 0)
			gone_at = (int)i;
	}
	int i = free_at >= 0 ? free_at : gone_at;
	if (i >= 0)
		take_slot(m, (uint32_t)i, l);
	return i;
}

struct dp_stats_moe_seg *dp_stats_moe_open(uint8_t *base, uint64_t now)
{
	struct dp_stats_moe_seg *m = calloc(1, sizeof(*m));
	if (!m) {
		dp_set_error("out of memory for the stats segment's MoE region");
		return NULL;
	}
	m->head = (struct dp_stats_moe *)(base + DP_STATS_MOE_OFFSET);
	m->slots = (struct dp_stats_moe_layer *)(base + DP_STATS_MOE_OFFSET + sizeof(*m->head));
	m->head->layers = DP_STATS_MOE_LAYERS;
	m->head->max_experts = DP_MAX_EXPERTS;
	m->head->window_ns = DP_STATS_MOE_WINDOW_NS;
	m->window_start = now;
	return m;
}

void dp_stats_moe_close(struct dp_stats_moe_seg *m)
{
	free(m);
}

/* Each duck's routed entries, as its NIC's worker sent them (dp_moe.c): the ducks that
 * answered and those that did not (a timed-out forward's rows were sent all the same). */
static void count_ducks(struct dp_stats_moe_layer *s, struct dp_world *w, const struct dp_fwd *f,
			const uint32_t *ducks, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		uint32_t d = ducks[i];
		int16_t t = d < DP_MAX_DUCKS ? w->duck_index[d] : -1;
		if (t >= 0 && f->rx[t].moe_entries)
			add64(&s->duck_rows[d], f->rx[t].moe_entries);
	}
}

void dp_stats_moe_forward(struct dp_stats_moe_seg *m, struct dp_world *w, const struct dp_fwd *f,
			  const struct dp_fwd_summary *sum)
{
	const struct dp_layer *l = f->layer;
	struct dp_routing_header h;
	uint64_t need;
	if (!m || f->kind != DP_FWD_FORWARD || !(f->desc.flags & DP_DESC_FLAG_ROUTED) || !l ||
	    !l->moe || f->route_bytes < sizeof(h))
		return;
	memcpy(&h, f->route, sizeof(h));
	/* the dispatcher's checked copy passes this; it keeps a bug from reading past it */
	if (dp_routing_size(h.tokens, h.topk, &need) < 0 || need > f->route_bytes)
		return;
	const uint8_t *e0 = f->route + DP_ROUTING_HEADER_SIZE;
	int i = slot_of(m, l);
	if (i < 0) { /* every slot taken: counted, shown, not placed */
		uint64_t counted = dp_expert_load_count(e0, h.tokens, h.topk,
							n_experts_of(&l->moe->pl), m->scratch);
		add64(&m->head->untracked_forwards, 1);
		add64(&m->head->untracked_tokens, h.tokens);
		add64(&m->head->untracked_entries, counted);
		return;
	}
	struct dp_stats_moe_layer *s = &m->slots[i];
	uint64_t counted = dp_expert_load_count(e0, h.tokens, h.topk, s->n_experts, s->expert_tokens);
	add64(&s->forwards, 1);
	add64(&s->tokens, h.tokens);
	add64(&s->entries, counted);
	add64(&s->no_expert, (uint64_t)h.tokens * h.topk - counted);
	count_ducks(s, w, f, sum->answered, sum->nanswered);
	count_ducks(s, w, f, sum->missing, sum->nmissing);
	m->mem[i].busy = true;
}

/* End slot i's window at now: its growth since the window began becomes the recent
 * window, and its state and placement follow the layer table (control owns it). */
static void end_window(struct dp_stats_moe_seg *m, struct dp_world *w, uint32_t i, uint64_t now)
{
	struct dp_stats_moe_layer *s = &m->slots[i];
	struct moe_slot_mem *p = &m->mem[i];
	const struct dp_layer *l = dp_layer_find(w, s->layer);
	bool loaded = l && l->moe && dp_load_acquire_u32(&l->ready) &&
		      n_experts_of(&l->moe->pl) == s->n_experts;
	/* a placement moved under the same layer object: compared once a window */
	bool moved = loaded && !same_placement(s, &l->moe->pl);
	seq_begin(s);
	if (moved)
		copy_placement(s, &l->moe->pl);
	set_state(m, i, loaded ? DP_MOE_LAYER_STATE_LOADED : DP_MOE_LAYER_STATE_GONE);
	if (p->busy || p->shown) { /* else the window's counts are 0 and so they stay */
		for (uint32_t e = 0; e < s->n_experts; e++) {
			uint64_t v = s->expert_tokens[e];
			put32(&s->expert_recent[e], clamp32(v - p->expert[e]));
			p->expert[e] = v;
		}
		for (uint32_t d = 0; d < DP_MAX_DUCKS; d++) {
			uint64_t v = s->duck_rows[d];
			put32(&s->duck_recent[d], clamp32(v - p->duck[d]));
			p->duck[d] = v;
		}
	}
	put64(&s->recent_forwards, s->forwards - p->forwards);
	put64(&s->recent_tokens, s->tokens - p->tokens);
	put64(&s->window_end_ns, now);
	put64(&s->window_ns, now - m->window_start);
	seq_end(s);
	p->forwards = s->forwards;
	p->tokens = s->tokens;
	p->shown = p->busy;
	p->busy = false;
	p->layer = loaded ? l : NULL; /* NULL: its next forward looks at the placement */
}

void dp_stats_moe_tick(struct dp_stats_moe_seg *m, struct dp_world *w, uint64_t now)
{
	if (!m || now - m->window_start < DP_STATS_MOE_WINDOW_NS)
		return;
	for (uint32_t i = 0; i < DP_STATS_MOE_LAYERS; i++)
		if (m->slot_state[i] != DP_MOE_LAYER_STATE_FREE)
			end_window(m, w, i, now);
	m->window_start = now;
}
