/* test_ctl.c: the control decoder refuses lying lengths before msgpack-c allocates, and
 * the generated decoders check every field against the schema.
 *
 * Standalone: exit 0 pass, 1 fail (one line per failed check).
 */
#include <msgpack.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "dp_access.h"
#include "dp_ctl_gen.h"
#include "dp_msgpack.h"
#include "test_check.h"

static char why[256];

static int prescan(const void *buf, size_t len)
{
	why[0] = '\0';
	return dp_msgpack_prescan(buf, len, DP_MAX_NESTING, why, sizeof(why));
}

static int decode(const void *buf, size_t len, struct dp_ctl_request *r)
{
	why[0] = '\0';
	return dp_ctl_decode(buf, len, r, why, sizeof(why));
}

/* A request packed with msgpack-c: {"type": type, "req_id": 7, extra...}. */
struct packed {
	msgpack_sbuffer sb;
	msgpack_packer pk;
};

static void begin(struct packed *p, const char *type, uint32_t extra)
{
	msgpack_sbuffer_init(&p->sb);
	msgpack_packer_init(&p->pk, &p->sb, msgpack_sbuffer_write);
	msgpack_pack_map(&p->pk, 2 + extra);
	dp_msgpack_kv_str(&p->pk, "type", type);
	dp_msgpack_kv_u64(&p->pk, "req_id", 7);
}

static void test_prescan_refuses_lies(void)
{
	/* array32 declaring 2^32-1 elements in a few bytes: msgpack-c would reserve ~100 GiB */
	static const uint8_t bomb[] = { 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01, 0x02 };
	CHECK(prescan(bomb, sizeof(bomb)) < 0 && strstr(why, "array"), "%s", why);
	static const uint8_t mapbomb[] = { 0xdf, 0x80, 0x00, 0x00, 0x00, 0xa1, 'a', 0x01 };
	CHECK(prescan(mapbomb, sizeof(mapbomb)) < 0 && strstr(why, "map"), "%s", why);
	/* str32 of 1 GiB with 3 bytes behind it */
	static const uint8_t str[] = { 0xdb, 0x40, 0x00, 0x00, 0x00, 'a', 'b', 'c' };
	CHECK(prescan(str, sizeof(str)) < 0 && strstr(why, "string"), "%s", why);
	static const uint8_t bin[] = { 0xc6, 0x00, 0x01, 0x00, 0x00, 0x00 };
	CHECK(prescan(bin, sizeof(bin)) < 0, "bin32 longer than the message");
	static const uint8_t ext[] = { 0xc9, 0x7f, 0xff, 0xff, 0xff, 0x01 };
	CHECK(prescan(ext, sizeof(ext)) < 0, "ext32 longer than the message");
	static const uint8_t cut[] = { 0xdd, 0x00 };
	CHECK(prescan(cut, sizeof(cut)) < 0, "a length cut short");
	static const uint8_t c1[] = { 0xc1 };
	CHECK(prescan(c1, 1) < 0, "0xc1 is never msgpack");
	static const uint8_t trailing[] = { 0x01, 0x02 };
	CHECK(prescan(trailing, 2) < 0 && strstr(why, "after"), "%s", why);
	CHECK(prescan("", 0) < 0, "an empty message");
	/* nesting: [[[[...]]]] one deeper than allowed, then exactly the limit */
	uint8_t deep[64];
	memset(deep, 0x91, sizeof(deep));
	deep[DP_MAX_NESTING + 1] = 0x00;
	CHECK(prescan(deep, DP_MAX_NESTING + 2) < 0 && strstr(why, "nesting"), "%s", why);
	deep[DP_MAX_NESTING] = 0x00;
	CHECK(prescan(deep, DP_MAX_NESTING + 1) == 0, "nesting at the limit: %s", why);
	/* an honest message of every kind of object passes */
	struct packed p;
	begin(&p, "X", 6);
	dp_msgpack_key(&p.pk, "f");
	msgpack_pack_double(&p.pk, 1.5);
	dp_msgpack_key(&p.pk, "neg");
	msgpack_pack_int64(&p.pk, -70000);
	dp_msgpack_key(&p.pk, "bin");
	msgpack_pack_bin(&p.pk, 300);
	static char zeros[300];
	msgpack_pack_bin_body(&p.pk, zeros, sizeof(zeros));
	dp_msgpack_key(&p.pk, "arr");
	msgpack_pack_array(&p.pk, 70000);
	for (int i = 0; i < 70000; i++)
		msgpack_pack_nil(&p.pk);
	dp_msgpack_key(&p.pk, "ext");
	msgpack_pack_ext(&p.pk, 4, 1);
	msgpack_pack_ext_body(&p.pk, "abcd", 4);
	dp_msgpack_key(&p.pk, "b");
	msgpack_pack_true(&p.pk);
	CHECK(prescan(p.sb.data, p.sb.size) == 0, "an honest message: %s", why);
	msgpack_sbuffer_destroy(&p.sb);
}

static void test_decode_bombs_without_allocating(void)
{
	/* {"type": "LoadWeights", "req_id": 1, "ducks": array32(2^32-1)} in ~50 bytes */
	struct packed p;
	begin(&p, "LoadWeights", 1);
	dp_msgpack_key(&p.pk, "ducks");
	msgpack_sbuffer_write(&p.sb, "\xdd\xff\xff\xff\xff\x00\x00", 7);
	struct rlimit as = { 1ull << 30, 1ull << 30 };
	struct rlimit old;
	getrlimit(RLIMIT_AS, &old);
	as.rlim_max = old.rlim_max;
	setrlimit(RLIMIT_AS, &as); /* under ASan the limit is ignored; the check still holds */
	struct dp_ctl_request r;
	CHECK(decode(p.sb.data, p.sb.size, &r) == DP_ERROR_CODE_BAD_MESSAGE, "bomb: %s", why);
	setrlimit(RLIMIT_AS, &old);
	msgpack_sbuffer_destroy(&p.sb);
}

static void test_decode_checks_fields(void)
{
	struct dp_ctl_request r;
	struct packed p;

	begin(&p, "LoadWeights", 6);
	dp_msgpack_kv_u64(&p.pk, "layer", 3);
	dp_msgpack_kv_u64(&p.pk, "kind", 1);
	dp_msgpack_kv_u64(&p.pk, "dtype", 1);
	dp_msgpack_kv_u64(&p.pk, "hidden", 8);
	dp_msgpack_kv_u64(&p.pk, "ffn", 16);
	dp_msgpack_key(&p.pk, "ducks");
	msgpack_pack_array(&p.pk, 2);
	msgpack_pack_uint32(&p.pk, 0);
	msgpack_pack_uint32(&p.pk, 5);
	CHECK(decode(p.sb.data, p.sb.size, &r) == DP_ERROR_CODE_BAD_REQUEST &&
		      strstr(why, "LoadWeights.shard_sizes is required"),
	      "%s", why);
	CHECK(r.req_id == 7, "the req_id is kept to echo: %lu", (unsigned long)r.req_id);
	msgpack_sbuffer_destroy(&p.sb);

	begin(&p, "LoadWeights", 7);
	dp_msgpack_kv_u64(&p.pk, "layer", 3);
	dp_msgpack_kv_u64(&p.pk, "kind", 2);
	dp_msgpack_kv_u64(&p.pk, "dtype", 1);
	dp_msgpack_kv_u64(&p.pk, "hidden", 8);
	dp_msgpack_kv_u64(&p.pk, "ffn", 16);
	dp_msgpack_key(&p.pk, "ducks");
	msgpack_pack_array(&p.pk, 1);
	msgpack_pack_uint32(&p.pk, 5);
	dp_msgpack_key(&p.pk, "shard_sizes");
	msgpack_pack_array(&p.pk, 1);
	msgpack_pack_uint32(&p.pk, 16);
	CHECK(decode(p.sb.data, p.sb.size, &r) == 0, "%s", why);
	CHECK(r.type == DP_CTL_LOAD_WEIGHTS && r.u.load_weights.kind == 2 &&
		      r.u.load_weights.ducks_len == 1 && r.u.load_weights.ducks[0] == 5 &&
		      !r.u.load_weights.has_b_down && !r.u.load_weights.shared,
	      "decoded fields and defaults");
	msgpack_sbuffer_destroy(&p.sb);

	begin(&p, "LoadWeights", 1);
	dp_msgpack_kv_u64(&p.pk, "hidden", 1ull << 32);
	CHECK(decode(p.sb.data, p.sb.size, &r) == DP_ERROR_CODE_BAD_REQUEST &&
		      strstr(why, "LoadWeights.hidden"),
	      "%s", why);
	msgpack_sbuffer_destroy(&p.sb);

	begin(&p, "LoadWeights", 1);
	dp_msgpack_key(&p.pk, "ducks");
	msgpack_pack_array(&p.pk, 257);
	for (int i = 0; i < 257; i++)
		msgpack_pack_uint32(&p.pk, 1);
	CHECK(decode(p.sb.data, p.sb.size, &r) == DP_ERROR_CODE_BAD_REQUEST &&
		      strstr(why, "LoadWeights.ducks must be a list of 1 to 256"),
	      "%s", why);
	msgpack_sbuffer_destroy(&p.sb);

	begin(&p, "Attach", 3);
	dp_msgpack_kv_u64(&p.pk, "abi_major", 1);
	dp_msgpack_kv_u64(&p.pk, "pid", 1);
	char longpath[300];
	memset(longpath, 'a', sizeof(longpath) - 1);
	longpath[sizeof(longpath) - 1] = '\0';
	dp_msgpack_kv_str(&p.pk, "segment", longpath);
	CHECK(decode(p.sb.data, p.sb.size, &r) == DP_ERROR_CODE_BAD_REQUEST &&
		      strstr(why, "Attach.segment must be a string of 0 to 255"),
	      "%s", why);
	msgpack_sbuffer_destroy(&p.sb);

	begin(&p, "SetEpoch", 1);
	dp_msgpack_key(&p.pk, "epoch");
	msgpack_pack_nil(&p.pk);
	CHECK(decode(p.sb.data, p.sb.size, &r) == 0 && !r.u.set_epoch.has_epoch, "%s", why);
	msgpack_sbuffer_destroy(&p.sb);

	begin(&p, "SetEpoch", 1);
	dp_msgpack_kv_str(&p.pk, "epoch", "9");
	CHECK(decode(p.sb.data, p.sb.size, &r) == DP_ERROR_CODE_BAD_REQUEST &&
		      strstr(why, "SetEpoch.epoch must be an integer"),
	      "%s", why);
	msgpack_sbuffer_destroy(&p.sb);

	begin(&p, "NoSuchThing", 0);
	CHECK(decode(p.sb.data, p.sb.size, &r) == DP_ERROR_CODE_BAD_MESSAGE &&
		      strstr(why, "unknown message type"),
	      "%s", why);
	msgpack_sbuffer_destroy(&p.sb);
}

static void test_peer_credentials(void)
{
	uint32_t uid = 9, gid = 9, pid = 9;
	const char *ipc = "ipc:///run/x/control";
	CHECK(dp_peer_credentials(ipc, "localhost:1000:100:2639", &uid, &gid, &pid) && uid == 1000 &&
		      gid == 100 && pid == 2639,
	      "%u %u %u", uid, gid, pid);
	CHECK(dp_peer_credentials(ipc, "/run/x:y/control:0:0:1", &uid, &gid, &pid) && uid == 0 &&
		      pid == 1,
	      "a path with a colon");
	CHECK(!dp_peer_credentials(ipc, "127.0.0.1", &uid, &gid, &pid), "tcp: no credentials");
	CHECK(!dp_peer_credentials(ipc, NULL, &uid, &gid, &pid), "no property");
	CHECK(!dp_peer_credentials(ipc, "x:1:2:", &uid, &gid, &pid), "an empty pid");
	CHECK(!dp_peer_credentials(ipc, "x:1:-2:3", &uid, &gid, &pid), "a sign");
	CHECK(!dp_peer_credentials(ipc, "x:99999999999:2:3", &uid, &gid, &pid), "past 32 bits");
	/* a tcp:// peer's Peer-Address is its IP: an IPv6 one can end in ":0:7:5" (uid 0) */
	uid = 9;
	CHECK(!dp_peer_credentials("tcp://[::]:5555", "2001:db8::0:7:5", &uid, &gid, &pid) &&
		      uid == 9,
	      "tcp: an IPv6 address is not uid 0");
	CHECK(!dp_peer_credentials("tcp://127.0.0.1:5555", "localhost:1000:100:2639", &uid, &gid,
				   &pid),
	      "tcp: never credentials, whatever the address says");
	CHECK(dp_peer_credentials(ipc, "2001:db8::0:7:5", &uid, &gid, &pid) && uid == 0,
	      "ipc: the same tail is SO_PEERCRED");
}

int main(void)
{
	test_peer_credentials();
	test_prescan_refuses_lies();
	test_decode_bombs_without_allocating();
	test_decode_checks_fields();
	return test_result("test_ctl");
}
