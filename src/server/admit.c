/* Admission: the exports a client may ask for by name, and the
 * connections each client (its address, or its process on a Unix socket) may
 * hold at once (max_connections_per_client).
 *
 * Exports are added on the main thread before the listeners start and
 * only read after; the per-client counts are taken and given back by the
 * loops under clients_lock (a leaf).  A leaf file: it calls nothing else
 * of the server.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foliod/export.h"
#include "server/internal.h"

/* ---- exports ------------------------------------------------------------- */

int
server_add_export (struct server *s, struct export *e)
{
  struct export **n;

  for (size_t i = 0; i < s->nexports; i++)
    if (strcmp (s->exports[i]->name, e->name) == 0) {
      errno = EEXIST;
      return -1;
    }
  // NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers
  n = realloc (s->exports, (s->nexports + 1) * sizeof *n);
  if (!n)
    return -1;
  s->exports = n;
  s->exports[s->nexports++] = e;
  return 0;
}

void
server_no_default_export (struct server *s)
{
  s->no_default = 1;
}

/* An export released with --stop (foliod release) is no longer found. */
struct export *
server_find_export (struct server *s, const char *name)
{
  struct export *e = NULL;

  if (!*name)
    e = s->nexports && !s->no_default ? s->exports[0] : NULL; /* default */
  for (size_t i = 0; *name && i < s->nexports; i++)
    if (strcmp (s->exports[i]->name, name) == 0)
      e = s->exports[i];
  if (e && export_release_state (e) == EXPORT_STOPPED)
    return NULL;
  return e;
}

/* ---- connections per client (max_connections_per_client) ---------------- */

static struct client_count *
server_client_find (struct server *s, const char *key)
{
  for (struct client_count *k = s->clients; k; k = k->next)
    if (strcmp (k->key, key) == 0)
      return k;
  return NULL;
}

/* Count c under key until server_client_gone, if key is under
 * max_connections_per_client.  1: counted; 0: over the limit; -1: no
 * memory.  Any loop's thread. */
int
server_client_admit (struct server *s, struct conn *c, const char *key)
{
  struct client_count *k;
  int ret = 1;

  lock_or_die (&s->clients_lock);
  k = server_client_find (s, key);
  if (!k && (k = calloc (1, sizeof *k)) != NULL) {
    snprintf (k->key, sizeof k->key, "%s", key);
    k->next = s->clients;
    s->clients = k;             /* n == 0 for now */
  }
  if (!k)
    ret = -1;
  else if (k->n >= s->cfg.max_connections_per_client)
    ret = 0;
  else
    k->n++;
  unlock_or_die (&s->clients_lock);
  if (ret == 1) {
    snprintf (c->client_key, sizeof c->client_key, "%s", key);
    c->client_key_set = true;
  }
  return ret;
}

void
server_client_gone (struct conn *c)
{
  struct server *s = c->srv;
  struct client_count **p = &s->clients, *k;

  if (!c->client_key_set)
    return;
  c->client_key_set = false;
  lock_or_die (&s->clients_lock);
  while ((k = *p) && strcmp (k->key, c->client_key) != 0)
    p = &k->next;
  if (k && --k->n == 0) {
    *p = k->next;
    free (k);
  }
  unlock_or_die (&s->clients_lock);
}
