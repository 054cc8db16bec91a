/* A provider that answers other attributes, for the tests: preloaded, it wraps fi_getinfo
 * and changes every entry as the environment says, as a provider with those attributes
 * would answer (nothing else changes):
 *   NFAB_SHIM_TAG_BITS  ep_attr->mem_tag_format of this many bits
 *   NFAB_SHIM_MAX_MSG   ep_attr->max_msg_size
 *   NFAB_SHIM_MODE      bits added to info->mode
 *   NFAB_SHIM_MR_MODE   bits added to domain_attr->mr_mode */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>
#include <stdlib.h>

typedef int (*getinfo_fn)(uint32_t, const char *, const char *, uint64_t,
			  const struct fi_info *, struct fi_info **);

static int number(const char *name, unsigned long long *out)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return 0;
	*out = strtoull(v, NULL, 0);
	return 1;
}

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
	unsigned long long bits, max_msg, mode, mr_mode;
	int set_bits = number("NFAB_SHIM_TAG_BITS", &bits);
	int set_msg = number("NFAB_SHIM_MAX_MSG", &max_msg);
	int set_mode = number("NFAB_SHIM_MODE", &mode);
	int set_mr = number("NFAB_SHIM_MR_MODE", &mr_mode);
	for (struct fi_info *i = *info; i; i = i->next) {
		if (i->ep_attr && set_bits)
			i->ep_attr->mem_tag_format = bits >= 64 ? ~0ULL : (1ULL << bits) - 1;
		if (i->ep_attr && set_msg)
			i->ep_attr->max_msg_size = max_msg;
		if (set_mode)
			i->mode |= mode;
		if (i->domain_attr && set_mr)
			i->domain_attr->mr_mode |= (int)mr_mode;
	}
	return 0;
}
