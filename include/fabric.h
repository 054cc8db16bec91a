/*
 * The libfabric API surface nccl-net-fabric uses. build.rs runs bindgen over this header
 * (allowlisting fi_* / FI_*) and generates C wrappers for libfabric's static-inline
 * functions, which are compiled into the plugin.
 */
#ifndef NCCL_NET_FABRIC_FABRIC_H
#define NCCL_NET_FABRIC_FABRIC_H

#include <stdbool.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_tagged.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#endif
