/*
 * epd_list.h — intrusive doubly linked lists: the elements carry `prev`
 * and `next` pointers, the owner a `head` (and, for a list kept in order
 * of arrival, a `tail`) pointer; both ends are NULL-terminated.
 *
 * The shape BSD's <sys/queue.h> calls LIST and TAILQ, rather than the
 * circular lists of libuv's queue.h or Linux's list.h: the transport's
 * lists are walked as plain `for (e = head; e != NULL; e = e->next)`
 * everywhere, an empty list is a NULL head, and an element that is on no
 * list has NULL links — so the macros replace the hand-written unlinks
 * without changing a single pointer the code around them reads.
 *
 * Every macro takes an accessor N(e) that yields the struct holding the
 * links of element e: EPD_LIST_SELF for an element that holds its own; a
 * backend whose links live in a scratch area of another object (UCX's ops,
 * inside be_priv) passes its own accessor.  `head` and `tail` are lvalues
 * (evaluated only when the end they name changes); `e` is evaluated more
 * than once, so it must be a plain variable.  Nothing here allocates or
 * frees; the caller still owns the element after it leaves the list.
 */
#ifndef EPD_LIST_H
#define EPD_LIST_H

#include <stddef.h>

/* The accessor of an element that holds its own links. */
#define EPD_LIST_SELF(e) (e)

/* Puts `e` first in the list at `head`. */
#define EPD_LIST_INSERT_HEAD_N(N, head, e)                                                         \
    do {                                                                                           \
        N(e)->prev = NULL;                                                                         \
        N(e)->next = (head);                                                                       \
        if ((head) != NULL) {                                                                      \
            N(head)->prev = (e);                                                                   \
        }                                                                                          \
        (head) = (e);                                                                              \
    } while (0)

/* Takes `e` out of the list at `head` (a list without a tail pointer).
 * Its own links are left as they were (callers that reuse it clear them). */
#define EPD_LIST_REMOVE_N(N, head, e)                                                              \
    do {                                                                                           \
        if (N(e)->prev != NULL) {                                                                  \
            N(N(e)->prev)->next = N(e)->next;                                                      \
        } else {                                                                                   \
            (head) = N(e)->next;                                                                   \
        }                                                                                          \
        if (N(e)->next != NULL) {                                                                  \
            N(N(e)->next)->prev = N(e)->prev;                                                      \
        }                                                                                          \
    } while (0)

/* Puts `e` last in the list at `head` / `tail`. */
#define EPD_TLIST_INSERT_TAIL_N(N, head, tail, e)                                                  \
    do {                                                                                           \
        N(e)->prev = (tail);                                                                       \
        N(e)->next = NULL;                                                                         \
        if ((tail) != NULL) {                                                                      \
            N(tail)->next = (e);                                                                   \
        } else {                                                                                   \
            (head) = (e);                                                                          \
        }                                                                                          \
        (tail) = (e);                                                                              \
    } while (0)

/* Takes `e` out of the list at `head` / `tail`; its links as they were. */
#define EPD_TLIST_REMOVE_N(N, head, tail, e)                                                       \
    do {                                                                                           \
        if (N(e)->prev != NULL) {                                                                  \
            N(N(e)->prev)->next = N(e)->next;                                                      \
        } else {                                                                                   \
            (head) = N(e)->next;                                                                   \
        }                                                                                          \
        if (N(e)->next != NULL) {                                                                  \
            N(N(e)->next)->prev = N(e)->prev;                                                      \
        } else {                                                                                   \
            (tail) = N(e)->prev;                                                                   \
        }                                                                                          \
    } while (0)

/* The same for elements that hold their own links. */
#define EPD_LIST_INSERT_HEAD(head, e) EPD_LIST_INSERT_HEAD_N(EPD_LIST_SELF, head, e)
#define EPD_LIST_REMOVE(head, e) EPD_LIST_REMOVE_N(EPD_LIST_SELF, head, e)
#define EPD_TLIST_INSERT_TAIL(head, tail, e) EPD_TLIST_INSERT_TAIL_N(EPD_LIST_SELF, head, tail, e)
#define EPD_TLIST_REMOVE(head, tail, e) EPD_TLIST_REMOVE_N(EPD_LIST_SELF, head, tail, e)

/* for (e = head; e != NULL; e = e->next), for elements with their own
 * links.  The body must not take `e` off the list (keep the next one
 * first, as the hand-written loops do, when it might). */
#define EPD_LIST_FOREACH(e, head) for ((e) = (head); (e) != NULL; (e) = (e)->next)

#endif
