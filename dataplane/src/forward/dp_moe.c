/* dp_moe.c: a routed (mixture-of-experts) forward on one NIC (dp_moe.h).
 *
 * Per forward and NIC the worker:
 *   1. splits the dispatcher's checked host table (f->route) by the layer's placement
 *      into the NIC's wire table W, restricted to the NIC's ducks, each entry's expert
 *      written as its slot in that duck's bank (dp_routing_split), flag SHARED when the
 *      layer has a shared expert;
 *   2. works out what each targeted duck must answer: its section's distinct rows,
 *      ascending (every row for a duck of the shared expert's set), and where each
 *      reply row goes in the result (its row map);
 *   3. chooses broadcast (W then every row, once for the NIC) or unicast (per routed
 *      duck a one-section table, rows renumbered, then its rows alone; per duck of the
 *      shared set its section and every row) by bytes on the wire (dp_moe_choose),
 *      unless the descriptor forces one;
 *   4. sends the message(s) in chunks like any activation, FORWARD flagged ROUTED with
 *      rows and total of the message it belongs to, from where their bytes are
 *      (dp_tx_message): the table(s) from the context's table area, the rows straight
 *      from the client's slot, a unicast's rows gathered by iovec, never staged (issue
 *      28.6: no staging area decides the mode or bounds the forward); a NACK INPUT
 *      resends from the same places (dp_moe_resend).
 * Replies are then checked against what each duck was routed (dp_gather.c) and added
 * row by row through its row map (dp_moe_accumulate).
 */
#include "dp_moe.h"

#include <stdio.h>
#include <string.h>

#include "dp_fwd.h"
#include "dp_gather_view.h"
#include "dp_reduce.h"
#include "dp_tx.h"
#include "dp_wire.h"

/* --- the pure parts -------------------------------------------------------------------- */

enum dp_moe_mode dp_moe_choose(uint32_t flags, uint64_t bytes_broadcast,
			       uint64_t bytes_unicast)
{
	if (flags & DP_DESC_FLAG_MOE_BROADCAST)
		return DP_MOE_MODE_BROADCAST;
	if (flags & DP_DESC_FLAG_MOE_UNICAST)
		return DP_MOE_MODE_UNICAST;
	if (bytes_unicast >= bytes_broadcast)
		return DP_MOE_MODE_BROADCAST;
	return DP_MOE_MODE_UNICAST;
}

uint32_t dp_moe_row_map(const void *wire, const struct dp_routing_section *s, uint16_t *map)
{
	const uint8_t *p = (const uint8_t *)wire + s->offset;
	uint32_t n = 0;
	int32_t prev = -1;
	for (uint32_t j = 0; j < s->n_entries; j++) {
		uint16_t row;
		memcpy(&row, p + (uint64_t)j * DP_ROUTING_WIRE_ENTRY_SIZE, sizeof(row));
		if ((int32_t)row == prev)
			continue;
		if (n == s->n_rows) /* more rows than it says: a table the check refused */
			break;
		map[n++] = row;
		prev = row;
	}
	return n;
}

void dp_moe_accumulate(float *acc, uint32_t hidden, const uint16_t *map, uint64_t first,
		       const void *src, uint32_t n, uint8_t dtype)
{
	const uint8_t *p = src;
	uint32_t item = dp_dtype_size(dtype);
	uint64_t row = first / hidden;
	uint32_t col = (uint32_t)(first % hidden);
	while (n) {
		uint32_t seg = hidden - col < n ? hidden - col : n; /* the rest of this row */
		uint64_t to = map ? map[row] : row;
		dp_accumulate(acc + to * hidden, col, p, seg, dtype);
		p += (size_t)seg * item;
		n -= seg;
		row++;
		col = 0;
	}
}

/* The silent duck's reply row holding result row `row`: its map's index of it (the map
 * ascends), or row itself without a map; -1 when it had no such row. */
static int64_t silent_row(const uint16_t *map, uint32_t rows, uint32_t row)
{
	if (!map)
		return row < rows ? (int64_t)row : -1;
	uint32_t lo = 0, hi = rows;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (map[mid] < row)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < rows && map[lo] == row ? (int64_t)lo : -1;
}

void dp_moe_accumulate_rest(float *acc, uint32_t hidden, const uint16_t *map, uint64_t first,
			    const void *src, uint32_t n, uint8_t dtype, const uint16_t *silent_map,
			    uint32_t silent_rows, const struct dp_reasm *silent_got,
			    uint32_t silent_chunk_bytes)
{
	const uint8_t *p = src;
	uint32_t item = dp_dtype_size(dtype);
	uint64_t e = first, end = first + n;
	while (e < end) {
		uint64_t row = e / hidden, row_end = (row + 1) * hidden < end ? (row + 1) * hidden : end;
		int64_t j = silent_row(silent_map, silent_rows, map ? map[row] : (uint32_t)row);
		while (e < row_end) {
			/* the run up to the row's end, or to the end of the silent duck's chunk
			 * that holds these columns of its row */
			uint64_t run = row_end - e;
			bool summed = false;
			if (j >= 0 && silent_chunk_bytes) {
				uint64_t at = ((uint64_t)j * hidden + e % hidden) * item; /* its bytes */
				uint32_t k = (uint32_t)(at / silent_chunk_bytes);
				uint64_t left = ((uint64_t)(k + 1) * silent_chunk_bytes - at) / item;
				run = left < run ? left : run;
				summed = dp_reasm_has(silent_got, k);
				if (!run) { /* a chunk not of whole items: refused at admit */
					run = 1;
					summed = false;
				}
			}
			if (!summed)
				dp_moe_accumulate(acc, hidden, map, e, p + (e - first) * item,
						  (uint32_t)run, dtype);
			e += run;
		}
	}
}

/* --- the send -------------------------------------------------------------------------- */

/* Whether duck d is in the shared expert's set the forward uses (the dispatcher's
 * choice, f->shared): it computes its shared columns for every row, so it is sent and
 * answers every row. */
static bool in_shared_set(const struct dp_fwd *f, uint16_t d)
{
	return f->shared[d >> 6] >> (d & 63) & 1;
}

/* A duck of another shared set than the forward's: its bank holds shared columns, which
 * it computes for every row when its table says SHARED; its table must not (it is sent
 * its own rows, and answers them). */
static void not_shared(uint8_t *table)
{
	struct dp_routing_wire_header h;
	memcpy(&h, table, sizeof(h));
	h.flags &= (uint8_t)~DP_ROUTING_WIRE_FLAG_SHARED;
	memcpy(table, &h, sizeof(h));
}

/* One shared-set duck's table for a unicast: its section of W (if it has one) alone,
 * rows not renumbered, since it computes the shared expert for every row and gets them
 * all. Bytes written. */
static uint64_t shared_unicast_table(const uint8_t *wire, uint16_t duck, bool has_section,
				     const struct dp_routing_section *s, uint8_t *out)
{
	struct dp_routing_wire_header h;
	memcpy(&h, wire, sizeof(h));
	h.n_ducks = has_section;
	h.entries = has_section ? s->n_entries : 0;
	memcpy(out, &h, sizeof(h));
	if (!has_section)
		return DP_ROUTING_WIRE_HEADER_SIZE;
	struct dp_routing_wire_duck wd = { duck, (uint16_t)s->n_rows, s->n_entries };
	memcpy(out + DP_ROUTING_WIRE_HEADER_SIZE, &wd, sizeof(wd));
	memcpy(out + DP_ROUTING_WIRE_HEADER_SIZE + DP_ROUTING_WIRE_DUCK_SIZE, wire + s->offset,
	       (uint64_t)s->n_entries * DP_ROUTING_WIRE_ENTRY_SIZE);
	return DP_ROUTING_WIRE_HEADER_SIZE + DP_ROUTING_WIRE_DUCK_SIZE +
	       (uint64_t)s->n_entries * DP_ROUTING_WIRE_ENTRY_SIZE;
}

/* The context's table area: the table(s) its messages on this NIC begin with. */
static uint8_t *tables_of(const struct dp_gather_view *v, const struct dp_fwd *f)
{
	return v->moe_tables + (uint64_t)f->index * v->moe_table_cap;
}

/* The message rx's duck was sent (dp_tx_message's description): its table, then every row
 * of the slot in order, or (a unicast without shared expert) its rows by its row map. */
static void duck_message(const struct dp_gather_view *v, const struct dp_fwd *f,
			 const struct dp_duck_rx *rx, struct dp_tx_msg *m)
{
	const struct dp_layer *l = f->layer;
	uint64_t row_bytes = (uint64_t)l->hidden * dp_dtype_size(l->dtype);
	uint32_t rows = rx->moe_gather ? rx->moe_rows : f->rows;
	uint64_t total = rx->moe_tsize + rows * row_bytes;
	struct dp_wire_header *h = &m->tpl;
	dp_wire_init(h, DP_WIRE_OP_FORWARD, v->session, f->desc.epoch);
	h->flags = DP_WIRE_FLAG_ROUTED;
	h->dtype = l->dtype;
	h->forward_id = f->wire_id | (uint64_t)rx->fo_tag << DP_WIRE_FORWARD_TAG_SHIFT;
	h->layer = l->id;
	h->tensor = l->bank; /* the generation of the placement it was planned on */
	h->duck = rx->moe_to;
	h->chunks = dp_wire_chunk_count(total, v->payload);
	h->total = total;
	h->rows = rows;
	m->table = rx->moe_table;
	m->tsize = rx->moe_tsize;
	m->rows = f->act;
	m->row_bytes = row_bytes;
	m->map = rx->moe_gather ? rx->moe_map : NULL;
}

uint32_t dp_moe_chunks(const struct dp_gather_view *v, const struct dp_fwd *f,
		       const struct dp_duck_rx *rx)
{
	struct dp_tx_msg m;
	duck_message(v, f, rx, &m);
	return m.tpl.chunks;
}

void dp_moe_resend(const struct dp_gather_view *v, struct dp_fwd *f, const struct dp_duck_rx *rx,
		   const struct sockaddr_in *dst, uint32_t first, uint32_t n)
{
	struct dp_tx_msg m;
	duck_message(v, f, rx, &m);
	/* the slot's owner: a backend that sends in place keeps the slot until it is done */
	uint64_t copied = dp_tx_message(v->tx, dst, &m, &f->part[v->nic].owner, first, n);
	if (copied)
		dp_count(v->counters, DP_C_moe_copied_bytes, copied);
}

/* What one targeted duck of this NIC is routed in W: its section, if it has one. */
struct routed_duck {
	uint16_t duck;
	bool has_section;
	struct dp_routing_section s;
};

static void send_broadcast(const struct dp_gather_view *v, struct dp_fwd *f,
			   const struct routed_duck *rd, uint32_t nrd, uint64_t wsize,
			   uint64_t bytes_broadcast)
{
	uint8_t *table = tables_of(v, f);
	uint16_t *maps = v->moe_maps + (uint64_t)f->index * v->moe_map_cap;
	memcpy(table, v->moe_wire, wsize); /* W outlives the next forward's split: resends */
	struct dp_duck_rx any = { .moe_table = table, .moe_tsize = (uint32_t)wsize,
				  .moe_to = DP_WIRE_ANY_DUCK };
	uint32_t used = 0;
	for (uint32_t i = 0; i < nrd; i++) {
		struct dp_duck_rx *rx = &f->rx[v->duck_index[rd[i].duck]];
		rx->moe_entries = rd[i].has_section ? rd[i].s.n_entries : 0;
		if (in_shared_set(f, rd[i].duck)) {
			rx->moe_rows = f->rows; /* the shared expert: every row, in order */
			rx->moe_map = NULL;
		} else {
			rx->moe_map = maps + used;
			rx->moe_rows = dp_moe_row_map(table, &rd[i].s, maps + used);
			used += rx->moe_rows;
		}
		rx->moe_table = table;
		rx->moe_tsize = (uint32_t)wsize;
		rx->moe_gather = false;
		rx->moe_to = DP_WIRE_ANY_DUCK;
	}
	const struct dp_nic_cfg *nic = v->nic_cfg;
	uint32_t chunks = dp_moe_chunks(v, f, &any);
	if (nic->use_broadcast)
		dp_moe_resend(v, f, &any, &nic->broadcast, 0, chunks);
	else
		for (uint32_t i = 0; i < nrd; i++)
			dp_moe_resend(v, f, &any, dp_gather_duck_addr(v, rd[i].duck), 0, chunks);
	f->part[v->nic].moe_unicast = false;
	dp_count(v->counters, DP_C_moe_broadcasts, 1);
	dp_count(v->counters, DP_C_moe_bytes, bytes_broadcast);
}

static void send_unicast(const struct dp_gather_view *v, struct dp_fwd *f,
			 const struct routed_duck *rd, uint32_t nrd, uint64_t wsize)
{
	const struct dp_layer *l = f->layer;
	uint8_t *tables = tables_of(v, f);
	uint16_t *maps = v->moe_maps + (uint64_t)f->index * v->moe_map_cap;
	uint64_t row_bytes = (uint64_t)l->hidden * dp_dtype_size(l->dtype), at = 0, sent = 0;
	uint32_t used = 0;
	/* the tables fit: each duck's is a header, a directory entry and its section's
	 * entries, at most 24 bytes a duck and 8 an entry of W: moe_table_cap's bound */
	for (uint32_t i = 0; i < nrd; i++) {
		struct dp_duck_rx *rx = &f->rx[v->duck_index[rd[i].duck]];
		uint8_t *table = tables + at;
		uint64_t tsize;
		if (in_shared_set(f, rd[i].duck)) {
			tsize = shared_unicast_table(v->moe_wire, rd[i].duck, rd[i].has_section,
						     &rd[i].s, table);
			rx->moe_rows = f->rows;
			rx->moe_map = NULL;
			rx->moe_gather = false; /* every row, in order, from the slot */
		} else {
			char why[96];
			if (dp_routing_wire_unicast(v->moe_wire, wsize, rd[i].duck, table,
						    v->moe_table_cap - at, maps + used,
						    v->moe_map_cap - used, &tsize, why, sizeof(why)) < 0) {
				DP_ERROR("forward %lu duck %u: unicast table: %s; this is a bug",
					 (unsigned long)f->wire_id, rd[i].duck, why);
				/* it gets nothing and the forward times out naming it; a NACK of
				 * it finds no table to resend (not the last forward's) */
				rx->moe_table = NULL;
				rx->moe_tsize = 0;
				continue;
			}
			if (l->moe->n_shared_sets > 1)
				not_shared(table);
			rx->moe_map = maps + used;
			rx->moe_rows = rd[i].s.n_rows;
			rx->moe_gather = true; /* its rows, by its row map, from the slot */
			used += rx->moe_rows;
		}
		rx->moe_entries = rd[i].has_section ? rd[i].s.n_entries : 0;
		rx->moe_table = table;
		rx->moe_tsize = (uint32_t)tsize;
		rx->moe_to = rd[i].duck;
		dp_moe_resend(v, f, rx, dp_gather_duck_addr(v, rd[i].duck), 0,
			      dp_moe_chunks(v, f, rx));
		at += tsize;
		sent += tsize + (uint64_t)rx->moe_rows * row_bytes;
	}
	f->part[v->nic].moe_unicast = true;
	dp_count(v->counters, DP_C_moe_unicasts, 1);
	dp_count(v->counters, DP_C_moe_bytes, sent);
}

int dp_moe_send(const struct dp_gather_view *v, struct dp_fwd *f)
{
	const struct dp_layer *l = f->layer;
	const struct dp_layer_moe *moe = l->moe;
	uint64_t wsize, nic_routed[DP_MAX_DUCKS / 64];
	char why[96] = "no duck of the NIC is routed"; /* the split says why when it refuses */
	uint8_t flags = moe->has_shared ? DP_ROUTING_WIRE_FLAG_SHARED : 0;
	/* the dispatcher's snapshot of the ducks known lost, not the live bitmaps: its
	 * targets and this split must send each (token, expert) to the same replica */
	const struct dp_routing_placement *pl = &moe->pl;
	const uint16_t *slots = moe->slots;
	if (f->lost[0] | f->lost[1] | f->lost[2] | f->lost[3]) {
		dp_routing_live(&moe->pl, moe->slots, f->lost, v->moe_live, v->moe_live_slots);
		pl = v->moe_live;
		slots = v->moe_live_slots;
	}
	if (dp_routing_split(f->route, f->route_bytes, pl, slots, flags, v->nic_ducks,
			     v->moe_wire, v->moe_wire_cap, &wsize, nic_routed, why,
			     sizeof(why)) < 0 ||
	    wsize == 0) {
		DP_ERROR("forward %lu: split for nic %u: %s; this is a bug", (unsigned long)f->wire_id,
			 v->nic, why);
		snprintf(f->message, sizeof(f->message), "nic %u: the routing split failed: %s",
			 v->nic, why);
		return -1;
	}
	/* this NIC's targets (the dispatcher's, by the same placement): their sections and
	 * what each mode would put on the wire */
	struct routed_duck rd[DP_MAX_DUCKS];
	uint32_t nrd = 0;
	uint64_t row_bytes = (uint64_t)l->hidden * dp_dtype_size(l->dtype), bytes_unicast = 0;
	for (uint32_t i = 0; i < v->nducks; i++) {
		uint16_t d = v->ducks[i];
		if (!dp_targets_has(f->targets, d))
			continue;
		struct routed_duck *r = &rd[nrd++];
		*r = (struct routed_duck){ .duck = d }; /* no section: its counts stay 0 */
		r->has_section = dp_routing_wire_section(v->moe_wire, wsize, d, &r->s) == 0;
		uint64_t msg;
		if (in_shared_set(f, d))
			msg = DP_ROUTING_WIRE_HEADER_SIZE +
			      (r->has_section ? DP_ROUTING_WIRE_DUCK_SIZE +
							DP_ROUTING_WIRE_ENTRY_SIZE * r->s.n_entries
					      : 0) +
			      f->bytes;
		else
			msg = DP_ROUTING_WIRE_HEADER_SIZE + DP_ROUTING_WIRE_DUCK_SIZE +
			      DP_ROUTING_WIRE_ENTRY_SIZE * r->s.n_entries + r->s.n_rows * row_bytes;
		bytes_unicast += msg;
	}
	bool use_broadcast = v->nic_cfg->use_broadcast;
	uint64_t bytes_broadcast = (wsize + f->bytes) * (use_broadcast ? 1 : nrd);
	/* several shared sets: one table to all would have every set compute the shared
	 * expert (a duck reads SHARED off its table); each duck gets its own instead */
	if (moe->n_shared_sets > 1 ||
	    dp_moe_choose(f->desc.flags, bytes_broadcast, bytes_unicast) == DP_MOE_MODE_UNICAST)
		send_unicast(v, f, rd, nrd, wsize);
	else
		send_broadcast(v, f, rd, nrd, wsize, bytes_broadcast);
	return 0;
}

/* --- failover within a forward ------------------------------------------------------- */

struct dp_duck_rx *dp_moe_fo_rx(const struct dp_gather_view *v, const struct dp_fwd *f,
				uint32_t tag)
{
	return &v->fo[(uint64_t)f->index * DP_FO_MAX + tag - 1];
}

/* Whether duck d can take over rows in f on this NIC: on it, not known lost at dispatch,
 * not due for failover itself in this pass (going: NULL, none), and not itself gone in f
 * (a target failed over, silent with nowhere to go, or one that answered NO_LAYER: its
 * bank is gone). */
static bool can_take_over(const struct dp_gather_view *v, const struct dp_fwd *f, uint16_t d,
			  const uint64_t *going)
{
	if (d >= DP_MAX_DUCKS || !(v->nic_ducks[d >> 6] >> (d & 63) & 1) ||
	    (f->lost[d >> 6] >> (d & 63) & 1) || (going && (going[d >> 6] >> (d & 63) & 1)))
		return false;
	if (!dp_targets_has(f->targets, d))
		return true;
	const struct dp_duck_rx *rx = &f->rx[v->duck_index[d]];
	return rx->state != 2 && rx->state != 3 && !rx->fo_stuck;
}

/* Where each expert of silent duck `duck`'s bank goes: to[slot] the replacement duck,
 * to_slot[slot] the expert's slot in its bank; the first replica after `duck` in the
 * expert's list (cyclically) that can take over, DP_WIRE_ANY_DUCK if none can (only the
 * experts its entries name matter). *n_slots: its bank's experts. */
static void replacements(const struct dp_gather_view *v, const struct dp_fwd *f, uint16_t duck,
			 const uint64_t *going, uint16_t *to, uint16_t *to_slot, uint32_t *n_slots)
{
	const struct dp_layer_moe *moe = f->layer->moe;
	const struct dp_routing_placement *pl = &moe->pl;
	uint32_t n = 0;
	for (uint32_t e = 0; e < pl->n_experts && e < DP_MAX_EXPERTS; e++) {
		uint32_t r = pl->replicas[e] < DP_MAX_REPLICAS ? pl->replicas[e] : DP_MAX_REPLICAS;
		const uint16_t *ducks = &pl->ducks[e * DP_MAX_REPLICAS];
		for (uint32_t i = 0; i < r; i++) {
			if (ducks[i] != duck)
				continue;
			uint16_t slot = moe->slots[e * DP_MAX_REPLICAS + i]; /* ascending e: n */
			to[slot] = DP_WIRE_ANY_DUCK;
			for (uint32_t k = 1; k < r; k++) {
				uint32_t j = (i + k) % r;
				if (can_take_over(v, f, ducks[j], going)) {
					to[slot] = ducks[j];
					to_slot[slot] = moe->slots[e * DP_MAX_REPLICAS + j];
					break;
				}
			}
			n++;
		}
	}
	*n_slots = n;
}

/* The failover message to duck `to`: the entries of the silent duck's section (at sec in
 * its table, rows real or renumbered by its map) whose expert goes to `to`, as a
 * one-section table at out, rows renumbered, their real rows into map. Bytes written,
 * or 0 when it does not fit (cap, map_cap). *rows, *entries: its counts. */
static uint64_t failover_table(const struct dp_duck_rx *silent, const uint8_t *sec, uint32_t n,
			       const uint16_t *to, const uint16_t *to_slot, uint16_t duck_to,
			       uint8_t *out, uint64_t cap, uint16_t *map, uint32_t map_cap,
			       uint32_t *rows, uint32_t *entries)
{
	uint64_t base = DP_ROUTING_WIRE_HEADER_SIZE + DP_ROUTING_WIRE_DUCK_SIZE;
	uint32_t m = 0, nr = 0;
	int32_t prev = -1;
	for (uint32_t j = 0; j < n; j++) {
		struct dp_routing_wire_entry we;
		memcpy(&we, sec + (uint64_t)j * DP_ROUTING_WIRE_ENTRY_SIZE, sizeof(we));
		if (to[we.expert] != duck_to)
			continue;
		/* the real row: a unicast's are renumbered through its map, a broadcast's not */
		uint16_t row = silent->moe_gather ? silent->moe_map[we.row] : we.row;
		if ((int32_t)row != prev) {
			if (nr == map_cap)
				return 0;
			map[nr++] = row;
			prev = row;
		}
		if (base + (uint64_t)(m + 1) * DP_ROUTING_WIRE_ENTRY_SIZE > cap)
			return 0;
		we.row = (uint16_t)(nr - 1);
		we.expert = to_slot[we.expert];
		memcpy(out + base + (uint64_t)m * DP_ROUTING_WIRE_ENTRY_SIZE, &we, sizeof(we));
		m++;
	}
	struct dp_routing_wire_header wh = { .magic = DP_ROUTING_WIRE_MAGIC,
					     .version = DP_ROUTING_VERSION,
					     .flags = 0, /* its experts only, never the shared one */
					     .n_ducks = 1,
					     .rows = nr,
					     .entries = m };
	struct dp_routing_wire_duck wd = { duck_to, (uint16_t)nr, m };
	memcpy(out, &wh, sizeof(wh));
	memcpy(out + DP_ROUTING_WIRE_HEADER_SIZE, &wd, sizeof(wd));
	*rows = nr;
	*entries = m;
	return base + (uint64_t)m * DP_ROUTING_WIRE_ENTRY_SIZE;
}

/* The duck that computes silent shared-set duck `duck`'s shared columns in its stead:
 * the duck of another set with the same columns that can take over (the rule is
 * dp_load_moe_shared_stand_in's), or DP_WIRE_ANY_DUCK. */
static uint16_t shared_stand_in(const struct dp_gather_view *v, const struct dp_fwd *f,
				uint16_t duck, const uint64_t *going)
{
	const struct dp_layer *l = f->layer;
	int16_t i = l->index[duck % DP_MAX_DUCKS];
	uint64_t can[DP_MAX_DUCKS / 64] = { 0 };
	for (uint32_t k = 0; k < v->nducks; k++)
		if (can_take_over(v, f, v->ducks[k], going))
			can[v->ducks[k] >> 6] |= 1ull << (v->ducks[k] & 63);
	uint32_t d = i < 0 ? DP_MAX_DUCKS
			   : dp_load_moe_shared_stand_in(l->moe, l->ducks, l->shard, l->nducks,
							 (uint32_t)i, can);
	return d < DP_MAX_DUCKS ? (uint16_t)d : DP_WIRE_ANY_DUCK;
}

/* The failover message that has duck `to` compute the shared expert's columns it holds
 * for every row in a silent duck's stead: a table of the header alone, flag SHARED (as a
 * shared-set duck with no routed rows is sent, shared_unicast_table), and every row of
 * the slot in order; written and awaited (its dp_duck_rx set), not sent yet. */
static int failover_shared(const struct dp_gather_view *v, struct dp_fwd *f,
			   const struct dp_duck_rx *silent, uint16_t to, uint64_t now)
{
	struct dp_nic_part *p = &f->part[v->nic];
	if (p->fo_table_used + DP_ROUTING_WIRE_HEADER_SIZE > v->moe_table_cap)
		return -1;
	uint8_t *table = v->fo_tables + (uint64_t)f->index * v->moe_table_cap + p->fo_table_used;
	struct dp_routing_wire_header wh = { .magic = DP_ROUTING_WIRE_MAGIC,
					     .version = DP_ROUTING_VERSION,
					     .flags = DP_ROUTING_WIRE_FLAG_SHARED,
					     .n_ducks = 0,
					     .rows = f->rows,
					     .entries = 0 };
	memcpy(table, &wh, sizeof(wh));
	struct dp_duck_rx *fo = dp_moe_fo_rx(v, f, ++p->fo_n);
	*fo = (struct dp_duck_rx){ .moe_rows = f->rows, .moe_table = table,
				   .moe_tsize = DP_ROUTING_WIRE_HEADER_SIZE,
				   .moe_gather = false, /* every row, in order: no map */
				   .moe_to = to, .fo_tag = p->fo_n, .progress_ns = now,
				   .fo_of = silent->reasm.have ? silent : NULL };
	p->fo_table_used += DP_ROUTING_WIRE_HEADER_SIZE;
	return 0;
}

int dp_moe_failover(const struct dp_gather_view *v, struct dp_fwd *f, struct dp_duck_rx *rx,
		    uint16_t duck, const uint64_t *going, uint64_t now)
{
	struct dp_nic_part *p = &f->part[v->nic];
	struct dp_routing_section s = { 0 };
	if (!rx->moe_table)
		return -1;
	/* a duck of the forward's shared set computes its shared columns for every row: they
	 * go to the duck of another set that holds the same ones; its routed rows, if its
	 * table has a section, go to their replicas as any duck's */
	bool shared = in_shared_set(f, duck);
	bool has_section = dp_routing_wire_section(rx->moe_table, rx->moe_tsize, duck, &s) == 0;
	if (!shared && !has_section)
		return -1;
	uint16_t stand_in = shared ? shared_stand_in(v, f, duck, going) : DP_WIRE_ANY_DUCK;
	if (shared && stand_in == DP_WIRE_ANY_DUCK)
		return -1;
	uint16_t to[DP_MAX_EXPERTS], to_slot[DP_MAX_EXPERTS]; /* by its bank slot */
	uint32_t n_slots;
	replacements(v, f, duck, going, to, to_slot, &n_slots);
	/* the replacements its entries name, in order of first use: one message each, and
	 * one for the shared columns; each takes a tag of the part's DP_FO_MAX */
	uint16_t dest[DP_FO_MAX];
	uint32_t ndest = 0;
	if (p->fo_n + shared > DP_FO_MAX)
		return -1;
	const uint8_t *sec = rx->moe_table + s.offset;
	for (uint32_t j = 0; has_section && j < s.n_entries; j++) {
		struct dp_routing_wire_entry we;
		memcpy(&we, sec + (uint64_t)j * DP_ROUTING_WIRE_ENTRY_SIZE, sizeof(we));
		if (we.expert >= n_slots || to[we.expert] == DP_WIRE_ANY_DUCK)
			return -1; /* no live replica can take it (or not a slot of its bank) */
		uint32_t k = 0;
		while (k < ndest && dest[k] != to[we.expert])
			k++;
		if (k == ndest) {
			if (p->fo_n + shared + ndest >= DP_FO_MAX)
				return -1; /* the tags ran out: nothing sent */
			dest[ndest++] = to[we.expert];
		}
	}
	/* every message written before any is sent: one that does not fit leaves nothing
	 * outstanding (the areas hold every entry once and a header per tag: cannot happen) */
	uint8_t first_tag = p->fo_n;
	uint64_t table_used = p->fo_table_used;
	uint32_t map_used = p->fo_map_used;
	int rc = shared ? failover_shared(v, f, rx, stand_in, now) : 0;
	for (uint32_t k = 0; rc == 0 && k < ndest; k++) {
		uint8_t *table = v->fo_tables + (uint64_t)f->index * v->moe_table_cap +
				 p->fo_table_used;
		uint16_t *map = v->fo_maps + (uint64_t)f->index * v->moe_map_cap + p->fo_map_used;
		uint32_t rows = 0, entries = 0;
		uint64_t tsize = failover_table(rx, sec, s.n_entries, to, to_slot, dest[k], table,
						v->moe_table_cap - p->fo_table_used, map,
						v->moe_map_cap - p->fo_map_used, &rows, &entries);
		if (!tsize) {
			rc = -1;
			break;
		}
		struct dp_duck_rx *fo = dp_moe_fo_rx(v, f, ++p->fo_n);
		*fo = (struct dp_duck_rx){ .moe_rows = rows, .moe_entries = entries, .moe_map = map,
					   .moe_table = table, .moe_tsize = (uint32_t)tsize,
					   .moe_gather = true, .moe_to = dest[k],
					   .fo_tag = p->fo_n,
					   /* its first NACK one RTO of it from now */
					   .progress_ns = now,
					   /* what of the silent duck's reply was summed, it skips */
					   .fo_of = rx->reasm.have ? rx : NULL };
		p->fo_table_used += tsize;
		p->fo_map_used += rows;
	}
	if (rc < 0) {
		p->fo_n = first_tag;
		p->fo_table_used = table_used;
		p->fo_map_used = map_used;
		return -1;
	}
	for (uint32_t tag = first_tag + 1u; tag <= p->fo_n; tag++) {
		struct dp_duck_rx *fo = dp_moe_fo_rx(v, f, tag);
		dp_moe_resend(v, f, fo, dp_gather_duck_addr(v, fo->moe_to), 0,
			      dp_moe_chunks(v, f, fo));
		DP_DEBUG("forward %lu: duck %u silent, %u rows (%u entries%s) failed over to duck "
			 "%u",
			 (unsigned long)f->wire_id, duck, fo->moe_rows, fo->moe_entries,
			 fo->moe_gather ? "" : ", its shared columns", fo->moe_to);
	}
	dp_count(v->counters, DP_C_moe_failovers, 1);
	return 0;
}
