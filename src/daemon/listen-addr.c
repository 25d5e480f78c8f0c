/* Listen addresses: "HOST:PORT", "[V6]:PORT", ":PORT" or "PORT", split
 * (listen, the server's sockets) and resolved (metrics-listen).  Below
 * both the configuration (config.c checks each at its line) and the
 * metrics endpoint (metrics.c binds it), which call it and not each
 * other. */
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "foliod/util.h"
#include "daemon/daemon.h"

int
parse_listen (const char *s, char *host, size_t hostlen,
              char *port, size_t portlen)
{
  const char *p, *colon;
  size_t hl;
  unsigned portnum;

  if (s[0] == '[') {
    const char *close = strchr (s, ']');
    if (close == NULL || close[1] != ':')
      return -1;
    hl = (size_t) (close - s - 1);
    p = s + 1;
    colon = close + 1;
  } else {
    colon = strrchr (s, ':');
    if (colon && memchr (s, ':', (size_t) (colon - s)))
      return -1;             /* bare IPv6 without brackets is ambiguous */
    p = s;
    hl = colon ? (size_t) (colon - s) : 0;
  }
  if (hl >= hostlen)
    return -1;
  memcpy (host, p, hl);
  host[hl] = '\0';
  s = colon ? colon + 1 : s;
  if (parse_uint (s, 1, 65535, &portnum) == -1 || strlen (s) >= portlen)
    return -1;
  strcpy (port, s);
  return 0;
}

int
metrics_addr_parse (const char *s, struct metrics_addr *a, char *err,
                    size_t errlen)
{
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_NUMERICSERV };
  struct addrinfo *res;
  char host[256], port[16];
  int r;

  if (parse_listen (s, host, sizeof host, port, sizeof port) == -1) {
    snprintf (err, errlen, "bad address '%s': expected HOST:PORT, "
              "[IPV6]:PORT or :PORT", s);
    return -1;
  }
  if (host[0] == '\0')
    strcpy (host, "127.0.0.1");
  r = getaddrinfo (host, port, &hints, &res);
  if (r != 0) {
    snprintf (err, errlen, "bad address '%s': %s", s, gai_strerror (r));
    return -1;
  }
  memcpy (&a->ss, res->ai_addr, res->ai_addrlen);
  a->len = res->ai_addrlen;
  snprintf (a->text, sizeof a->text, "%s%s%s:%s",
            res->ai_family == AF_INET6 ? "[" : "", host,
            res->ai_family == AF_INET6 ? "]" : "", port);
  freeaddrinfo (res);
  return 0;
}
