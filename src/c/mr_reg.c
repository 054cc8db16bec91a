/*
 * fi_mr_regattr with iface and device set. struct fi_mr_attr changed shape between
 * libfabric 1.x and 2.x (mr_iov moved into an anonymous union, fields were added), so it is
 * filled here in C, where designated initializers read the same against either header.
 */
#include <string.h>
#include <sys/uio.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

int nccl_net_fabric_mr_reg(struct fid_domain *domain, void *buf, size_t len, uint64_t access,
                           uint64_t requested_key, int iface, int device, struct fid_mr **mr) {
  struct iovec iov = {.iov_base = buf, .iov_len = len};
  struct fi_mr_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = access;
  attr.requested_key = requested_key;
  attr.iface = (enum fi_hmem_iface)iface;
  attr.device.cuda = device;
  return fi_mr_regattr(domain, &attr, 0, mr);
}
