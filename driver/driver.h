/* driver/: the top layer of the library. It drives the others in order
 * (frontend -> passes -> runtime) for whole jobs such as training and
 * sampling, so that no lower layer has to reach up. Public API:
 * include/dsc/trainer.h. Prefix drv_. */
#ifndef DSC_DRIVER_H
#define DSC_DRIVER_H

#include "dsc/exec.h"
#include "dsc/frontend.h"
#include "dsc/trainer.h"
#include "runtime/runtime.h"

#endif
