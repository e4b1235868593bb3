/* memra-gateway: the OpenAI-compatible HTTP front of memra.
 *   memra-gateway --config conf/memra.json
 *   memra-gateway keys add|disable|list --keyring FILE ... */
#include <stdio.h>
#include <string.h>

#include "gateway/auth.h"
#include "gateway/gw.h"

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "keys"))
        return mr_keys_cli(argc - 1, argv + 1);
    const char *config = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            config = argv[++i];
        else {
            fprintf(stderr, "usage: memra-gateway --config FILE\n"
                            "       memra-gateway keys add|disable|list --keyring FILE ...\n");
            return 2;
        }
    }
    if (!config) {
        fprintf(stderr, "memra-gateway: --config FILE is required (see conf/memra.json)\n");
        return 2;
    }
    return mr_gateway_main(config);
}
