/* A provider with too few tag bits, for the tests: preloaded, it wraps fi_getinfo and gives
 * every entry an ep_attr->mem_tag_format of NFAB_TAG_BITS bits (default 16), as a provider
 * whose tags are narrower than the plugin's layout would answer. Nothing else changes. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <rdma/fabric.h>
#include <stdlib.h>

typedef int (*getinfo_fn)(uint32_t, const char *, const char *, uint64_t,
			  const struct fi_info *, struct fi_info **);

int fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
	       const struct fi_info *hints, struct fi_info **info)
{
	static getinfo_fn real;
	if (!real)
		real = (getinfo_fn)dlsym(RTLD_NEXT, "fi_getinfo");
	if (!real)
		return -FI_ENOSYS;
	int ret = real(version, node, service, flags, hints, info);
	if (ret != 0)
		return ret;
	const char *b = getenv("NFAB_TAG_BITS");
	int bits = b ? atoi(b) : 16;
	uint64_t format = bits >= 64 ? ~0ULL : (1ULL << bits) - 1;
	for (struct fi_info *i = *info; i; i = i->next)
		if (i->ep_attr)
			i->ep_attr->mem_tag_format = format;
	return 0;
}
