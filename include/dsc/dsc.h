/* dsc: the whole public API. */
#ifndef DSC_H
#define DSC_H
#include "dsc/comm.h"
#include "dsc/core.h"
#include "dsc/exec.h"
#include "dsc/frontend.h"
#include "dsc/infer.h"
#include "dsc/interp.h"
#include "dsc/ir.h"
#include "dsc/mesh.h"
#include "dsc/passes.h"
#include "dsc/runtime.h"
#include "dsc/trace.h"
#include "dsc/train.h"
#include "dsc/trainer.h"
#endif
