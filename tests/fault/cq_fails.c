/* A provider fault for the tests, preloaded into a rank: every completion queue the process
 * opens through libfabric works normally until the file named by NFAB_CQ_FAIL_FILE exists;
 * from then on fi_cq_read, fi_cq_readfrom and fi_cq_readerr on it return -FI_EIO, as a
 * provider whose queue broke would. It wraps fi_fabric, then the fabric's domain call, then
 * the domain's cq_open, copying each operations table (sized by its own `size` field, so the
 * copy matches the libfabric that runs) and replacing the calls it needs. The copies are never
 * freed: a test process opens a handful. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A copy of an operations table, preceded by the original it was copied from, so each
 * wrapper finds the calls of the object's own provider (several providers are open at once
 * while the plugin probes). */
static void *copy_ops(const void *ops) {
	size_t size = *(const size_t *)ops;
	char *block = malloc(sizeof(void *) + size);
	if (!block)
		return NULL;
	memcpy(block, &ops, sizeof(void *));
	memcpy(block + sizeof(void *), ops, size);
	return block + sizeof(void *);
}

static const void *original(const void *copy) {
	const void *orig;
	memcpy(&orig, (const char *)copy - sizeof(void *), sizeof(void *));
	return orig;
}

#define REAL(obj, type) ((const struct type *)original((obj)->ops))

static int broken(void) {
	const char *f = getenv("NFAB_CQ_FAIL_FILE");
	struct stat st;
	return f && stat(f, &st) == 0;
}

static ssize_t cq_read(struct fid_cq *cq, void *buf, size_t count) {
	return broken() ? -FI_EIO : REAL(cq, fi_ops_cq)->read(cq, buf, count);
}

static ssize_t cq_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src) {
	return broken() ? -FI_EIO : REAL(cq, fi_ops_cq)->readfrom(cq, buf, count, src);
}

static ssize_t cq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags) {
	return broken() ? -FI_EIO : REAL(cq, fi_ops_cq)->readerr(cq, buf, flags);
}

static int cq_open(struct fid_domain *d, struct fi_cq_attr *attr, struct fid_cq **cq, void *ctx) {
	int ret = REAL(d, fi_ops_domain)->cq_open(d, attr, cq, ctx);
	if (ret)
		return ret;
	struct fi_ops_cq *ops = copy_ops((*cq)->ops);
	if (!ops)
		return 0;
	ops->read = cq_read;
	ops->readfrom = cq_readfrom;
	ops->readerr = cq_readerr;
	(*cq)->ops = ops;
	return 0;
}

static int domain(struct fid_fabric *f, struct fi_info *info, struct fid_domain **d, void *ctx) {
	int ret = REAL(f, fi_ops_fabric)->domain(f, info, d, ctx);
	if (ret)
		return ret;
	struct fi_ops_domain *ops = copy_ops((*d)->ops);
	if (!ops)
		return 0;
	ops->cq_open = cq_open;
	(*d)->ops = ops;
	return 0;
}

int fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context) {
	int (*real)(struct fi_fabric_attr *, struct fid_fabric **, void *) =
		dlvsym(RTLD_NEXT, "fi_fabric", "FABRIC_1.1");
	if (!real)
		return -FI_ENOSYS;
	int ret = real(attr, fabric, context);
	if (ret)
		return ret;
	struct fi_ops_fabric *ops = copy_ops((*fabric)->ops);
	if (!ops)
		return 0;
	ops->domain = domain;
	(*fabric)->ops = ops;
	return 0;
}
