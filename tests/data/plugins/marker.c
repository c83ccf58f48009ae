/* A TensorRT plugin library with no plugin creators, for tests: each entry point that
 * TensorRT's IPluginRegistry::loadLibrary calls (setLoggerFinder, getCreators) appends a
 * line "NAME PID" to the file that ROUTETUNE_TEST_PLUGIN_MARKS names. TensorRT then
 * refuses the library ("No creator returned"), after calling both. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void mark(const char *what) {
    const char *path = getenv("ROUTETUNE_TEST_PLUGIN_MARKS");
    if (path == NULL) return;
    FILE *f = fopen(path, "a");
    if (f == NULL) return;
    fprintf(f, "%s %d\n", what, (int)getpid());
    fclose(f);
}

void setLoggerFinder(void *finder) {
    (void)finder;
    mark("setLoggerFinder");
}

void *const *getCreators(int32_t *nbCreators) {
    mark("getCreators");
    *nbCreators = 0;
    return NULL;
}
