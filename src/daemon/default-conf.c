/* The built-in configuration: conf/foliod.conf, embedded verbatim.
 *
 * The assembler's .incbin copies the file into .rodata at build time, so
 * the documented example and the default the daemon runs can never drift
 * apart, without a code generator.  The path is relative to the directory
 * make runs the compiler in (the top of the tree); the Makefile makes this
 * object depend on the file.
 */
#include "daemon/daemon.h"

__asm__ (".section .rodata\n"
         ".global foliod_default_conf\n"
         ".type foliod_default_conf, @object\n"
         ".balign 16\n"
         "foliod_default_conf:\n"
         ".incbin \"conf/foliod.conf\"\n"
         ".byte 0\n"
         ".size foliod_default_conf, . - foliod_default_conf\n"
         ".previous\n");
