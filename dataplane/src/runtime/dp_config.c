/* dp_config.c: decode the msgpack configuration with msgpack-c's object API: the scalar
 * fields by the reader generated from duckpipe/schema/config.py (dp_config_gen.c), the
 * rest (addresses, enums, lists) and every bound here. */
#include "dp_config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_abi.h"
#include "dp_common.h"
#include "dp_config_gen.h"
#include "dp_msgpack.h"

static int get_addr(const msgpack_object *map, const char *ipkey, const char *portkey,
		    uint32_t default_port, struct sockaddr_in *out)
{
	char ip[64];
	uint32_t port = 0;
	if (dp_msgpack_str(map, ipkey, ip, sizeof(ip), "") < 0)
		return -1;
	if (portkey && dp_msgpack_u32(map, portkey, &port, default_port) < 0)
		return -1;
	memset(out, 0, sizeof(*out));
	out->sin_family = AF_INET;
	out->sin_port = htons((uint16_t)port);
	if (port > 65535 || inet_pton(AF_INET, ip, &out->sin_addr) != 1) {
		dp_set_error("'%s' = '%s' (port %u) is not an IPv4 address and port", ipkey, ip, port);
		return -1;
	}
	return 0;
}

/* A NIC's fields: the scalars by the generated reader (dp_config_gen.c), then those it
 * leaves to this file (ctlgen.CONFIG_BY_HAND): host_ip and host_port as one address, and
 * the strings broadcast and flow_steering, which the caller turns into an address and a
 * mode. */
static int read_nic_fields(const msgpack_object *o, struct dp_nic_cfg *nic, char *bcast,
			   size_t bcast_len, char *flow, size_t flow_len)
{
	if (dp_cfg_gen_read_nic(o, nic) < 0 ||
	    get_addr(o, "host_ip", "host_port", DP_CFG_NIC_DEFAULT_HOST_PORT, &nic->host) < 0 ||
	    dp_msgpack_str(o, "broadcast", bcast, bcast_len, DP_CFG_NIC_DEFAULT_BROADCAST) < 0 ||
	    dp_msgpack_str(o, "flow_steering", flow, flow_len, DP_CFG_NIC_DEFAULT_FLOW_STEERING) < 0)
		return -1;
	return 0;
}

/* A NIC's bounds and its flow_steering mode: what the schema allows, checked again here
 * because the file is input (another writer than `duckpipe dataplane` may have made it). */
static int check_nic(struct dp_nic_cfg *nic, const char *flow)
{
	if (nic->zc_hold_max_us < 1 || nic->zc_hold_max_us > 1000000) {
		dp_set_error("zc_hold_max_us %u is outside [1, 1000000]", nic->zc_hold_max_us);
		return -1;
	}
	if (nic->link_wait_ms > 60000) {
		dp_set_error("link_wait_ms %u is more than 60000 (a minute)", nic->link_wait_ms);
		return -1;
	}
	/* a port's ring takes a uint16 count; the port's own limits are checked at open */
	if (nic->rx_desc > 32768 || nic->tx_desc > 32768) {
		dp_set_error("rx_desc %u / tx_desc %u: at most 32768 descriptors (0: sized from "
			     "the topology)", nic->rx_desc, nic->tx_desc);
		return -1;
	}
	if (!strcmp(flow, "auto"))
		nic->flow_steering = DP_FLOW_AUTO;
	else if (!strcmp(flow, "off"))
		nic->flow_steering = DP_FLOW_OFF;
	else if (!strcmp(flow, "require"))
		nic->flow_steering = DP_FLOW_REQUIRE;
	else {
		dp_set_error("flow_steering '%s' is not auto, off or require", flow);
		return -1;
	}
	if (nic->mtu < 576 || nic->mtu > 65535) {
		dp_set_error("mtu %u is outside [576, 65535]", nic->mtu);
		return -1;
	}
	return 0;
}

/* broadcast (when set) with the port every duck listens on: one datagram for all ducks
 * instead of a unicast fan-out. */
static int read_broadcast(const msgpack_object *o, struct dp_nic_cfg *nic, const char *bcast)
{
	nic->use_broadcast = bcast[0] != '\0';
	if (!nic->use_broadcast)
		return 0;
	uint32_t port;
	if (dp_msgpack_u32(o, "broadcast_port", &port, DP_CFG_NIC_DEFAULT_BROADCAST_PORT) < 0 || port == 0 || port > 65535) {
		dp_set_error("broadcast needs 'broadcast_port', the port every duck listens on");
		return -1;
	}
	memset(&nic->broadcast, 0, sizeof(nic->broadcast));
	nic->broadcast.sin_family = AF_INET;
	nic->broadcast.sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, bcast, &nic->broadcast.sin_addr) != 1) {
		dp_set_error("broadcast '%s' is not an IPv4 address", bcast);
		return -1;
	}
	return 0;
}

/* The NIC's ducks into the topology's one list: ids in [0, 255] (the duck index is a
 * byte), each once across all NICs. */
static int read_ducks(const msgpack_object *o, struct dp_config *cfg, uint32_t index)
{
	const msgpack_object *ducks = dp_msgpack_get(o, "ducks");
	if (!ducks || ducks->type != MSGPACK_OBJECT_ARRAY) {
		dp_set_error("'ducks' must be a list");
		return -1;
	}
	for (uint32_t i = 0; i < ducks->via.array.size; i++) {
		const msgpack_object *d = &ducks->via.array.ptr[i];
		uint32_t id;
		if (cfg->nducks >= DP_ARRAY_LEN(cfg->ducks)) {
			dp_set_error("more than %zu ducks", DP_ARRAY_LEN(cfg->ducks));
			return -1;
		}
		struct dp_duck_cfg *dc = &cfg->ducks[cfg->nducks];
		if (dp_msgpack_u32(d, "id", &id, UINT32_MAX) < 0 || get_addr(d, "ip", "port", 0, &dc->addr) < 0) {
			dp_add_error_context("duck %u", i);
			return -1;
		}
		if (id > 255) {
			dp_set_error("duck %u: id %u is outside [0, 255]", i, id);
			return -1;
		}
		for (uint32_t k = 0; k < cfg->nducks; k++)
			if (cfg->ducks[k].id == id) {
				dp_set_error("duck id %u appears twice", id);
				return -1;
			}
		dc->id = (uint16_t)id;
		dc->nic = (uint16_t)index;
		cfg->nducks++;
	}
	return 0;
}

static int load_nic(const msgpack_object *o, struct dp_config *cfg, uint32_t index)
{
	struct dp_nic_cfg *nic = &cfg->nics[index];
	char bcast[64], flow[16];
	if (o->type != MSGPACK_OBJECT_MAP) {
		dp_set_error("must be a map");
		return -1;
	}
	if (read_nic_fields(o, nic, bcast, sizeof(bcast), flow, sizeof(flow)) < 0 ||
	    check_nic(nic, flow) < 0 || read_broadcast(o, nic, bcast) < 0)
		return -1;
	return read_ducks(o, cfg, index);
}

/* The whole file in one buffer (at most 1 MiB: the topology is small, and a bound keeps a
 * wrong path from filling memory). *buf is the caller's to free. */
static int read_file(const char *path, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		dp_set_error("cannot open config %s: %s", path, strerror(errno));
		return -1;
	}
	*buf = malloc(1 << 20);
	*len = *buf ? fread(*buf, 1, 1 << 20, f) : 0;
	fclose(f);
	if (!*buf || *len == 0 || *len == (1 << 20)) {
		free(*buf);
		dp_set_error("config %s is empty, unreadable or larger than 1 MiB", path);
		return -1;
	}
	return 0;
}

/* The top level's fields: the scalars by the generated reader (dp_config_gen.c), then
 * idle, a name dp_idle_parse turns into a strategy (cores and nics: read_cores,
 * read_nics). */
static int read_root_fields(const msgpack_object *root, struct dp_config *cfg)
{
	char idle[16];
	if (dp_cfg_gen_read(root, cfg) < 0 ||
	    dp_msgpack_str(root, "idle", idle, sizeof(idle), DP_CFG_DEFAULT_IDLE) < 0 ||
	    dp_idle_parse(idle, &cfg->idle) < 0)
		return -1;
	return 0;
}

/* The top level's bounds the agents rely on, refused at start (check_limits in
 * duckpipe/schema/config.py refuses the table quotas the same way, before the file). */
static int check_root(const struct dp_config *cfg)
{
	if (!cfg->control[0]) {
		dp_set_error("'control' (the ZeroMQ endpoint) is missing");
		return -1;
	}
	if (cfg->nack_min_us == 0 || cfg->nack_min_us > cfg->nack_max_us) {
		dp_set_error("nack_min_us %u must be above 0 and at most nack_max_us %u",
			     cfg->nack_min_us, cfg->nack_max_us);
		return -1;
	}
	if (cfg->max_inflight == 0 || (cfg->max_inflight & (cfg->max_inflight - 1)) ||
	    cfg->max_inflight > 4096) {
		dp_set_error("max_inflight %u must be a power of two up to 4096", cfg->max_inflight);
		return -1;
	}
	/* every client at its layer quota must leave the table room for the others */
	if ((uint64_t)cfg->client_max_layers * DP_MAX_CLIENTS > DP_LAYER_TABLE) {
		dp_set_error("client_max_layers %u x %d clients passes the layer table (%d): at most %d",
			     cfg->client_max_layers, DP_MAX_CLIENTS, DP_LAYER_TABLE,
			     DP_LAYER_TABLE / DP_MAX_CLIENTS);
		return -1;
	}
	if (cfg->client_max_per_pid == 0 || cfg->client_max_per_pid > DP_MAX_CLIENTS) {
		dp_set_error("client_max_per_pid %u is outside [1, %d]", cfg->client_max_per_pid,
			     DP_MAX_CLIENTS);
		return -1;
	}
	if (cfg->client_max_per_uid == 0 || cfg->client_max_per_uid > DP_MAX_CLIENTS) {
		dp_set_error("client_max_per_uid %u is outside [1, %d]", cfg->client_max_per_uid,
			     DP_MAX_CLIENTS);
		return -1;
	}
	/* at least one slot the admin's clients always find free */
	if (cfg->admin_reserved_clients == 0 || cfg->admin_reserved_clients >= DP_MAX_CLIENTS) {
		dp_set_error("admin_reserved_clients %u is outside [1, %d]",
			     cfg->admin_reserved_clients, DP_MAX_CLIENTS - 1);
		return -1;
	}
	if (cfg->max_connections == 0) {
		dp_set_error("max_connections must be at least 1");
		return -1;
	}
	return 0;
}

/* cores: the CPU of each runner in agent order; anything but a non-negative int (and
 * the runners past DP_MAX_CORES) stays unpinned (-1). */
static void read_cores(const msgpack_object *root, struct dp_config *cfg)
{
	const msgpack_object *cores = dp_msgpack_get(root, "cores");
	if (cores && cores->type == MSGPACK_OBJECT_ARRAY) {
		for (uint32_t i = 0; i < cores->via.array.size && i < DP_MAX_CORES; i++) {
			const msgpack_object *c = &cores->via.array.ptr[i];
			cfg->cores[i] = c->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int)c->via.u64 : -1;
		}
		cfg->ncores = cores->via.array.size;
	}
}

/* nics: 1 to DP_MAX_NICS, each with its ducks; a topology without any duck is refused. */
static int read_nics(const msgpack_object *root, struct dp_config *cfg)
{
	const msgpack_object *nics = dp_msgpack_get(root, "nics");
	if (!nics || nics->type != MSGPACK_OBJECT_ARRAY || nics->via.array.size == 0 ||
	    nics->via.array.size > DP_MAX_NICS) {
		dp_set_error("'nics' must list 1 to %d NICs", DP_MAX_NICS);
		return -1;
	}
	for (uint32_t i = 0; i < nics->via.array.size; i++) {
		if (load_nic(&nics->via.array.ptr[i], cfg, i) < 0) {
			dp_add_error_context("nic %u", i);
			return -1;
		}
		cfg->nnics++;
	}
	if (cfg->nducks == 0) {
		dp_set_error("the topology has no ducks");
		return -1;
	}
	return 0;
}

int dp_config_load(const char *path, struct dp_config *cfg)
{
	char *buf;
	size_t len;
	if (read_file(path, &buf, &len) < 0)
		return -1;
	msgpack_unpacked msg;
	msgpack_unpacked_init(&msg);
	size_t off = 0;
	int rc = -1;
	char why[160];
	/* nesting bounded before msgpack-c builds its objects (dp_msgpack_prescan) */
	if (dp_msgpack_prescan(buf, len, 8, why, sizeof(why)) < 0 ||
	    msgpack_unpack_next(&msg, buf, len, &off) != MSGPACK_UNPACK_SUCCESS) {
		dp_set_error("config %s is not one msgpack map", path);
		goto out;
	}
	const msgpack_object *root = &msg.data;
	memset(cfg, 0, sizeof(*cfg));
	for (uint32_t i = 0; i < DP_MAX_CORES; i++)
		cfg->cores[i] = -1;
	if (read_root_fields(root, cfg) < 0 || check_root(cfg) < 0)
		goto out;
	read_cores(root, cfg);
	if (read_nics(root, cfg) < 0)
		goto out;
	rc = 0;
out:
	msgpack_unpacked_destroy(&msg);
	free(buf);
	return rc;
}
