/* epd_test.h — what every cmocka test program includes. */
#ifndef EPD_TEST_H
#define EPD_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#endif
