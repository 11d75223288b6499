/* dsc: the whole public API. */
#ifndef DSC_H
#define DSC_H
#include "dsc/core.h"
#include "dsc/comm.h"
#include "dsc/exec.h"
#include "dsc/frontend.h"
#include "dsc/interp.h"
#include "dsc/ir.h"
#include "dsc/runtime.h"
#include "dsc/trace.h"
#include "dsc/passes.h"
#include "dsc/train.h"
#include "dsc/trainer.h"
#endif
