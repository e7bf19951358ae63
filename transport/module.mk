# transport/: the epd_xport core and its backends (ucx/, ofi/).
# The libfabric backend is built only when EPD_WITH_OFI=1 and its sources
# exist; without them EPD_WITH_OFI is forced to 0 so the core does not
# reference epd__xport_ofi_ops (EPD_CPPFLAGS expands EPD_WITH_OFI lazily).
XPORT_SRCS := $(wildcard transport/epd_xport*.c)
ifeq ($(EPD_WITH_UCX),1)
XPORT_SRCS += $(wildcard transport/ucx/*.c)
endif
ifeq ($(strip $(wildcard transport/ofi/*.c)),)
override EPD_WITH_OFI := 0
endif
ifeq ($(EPD_WITH_OFI),1)
XPORT_SRCS += $(wildcard transport/ofi/*.c)
endif
$(eval $(call epd_lib,epd_xport,$(XPORT_SRCS)))
