/* dp_udp.h: UDP socket options older libc headers may not name (values from linux/udp.h
 * and asm-generic/socket.h), shared by the socket backend and the duck emulator. */
#ifndef DP_UDP_H
#define DP_UDP_H

#include <netinet/udp.h>
#include <sys/socket.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103 /* GSO: one send cut into datagrams of this many bytes */
#endif
#ifndef UDP_GRO
#define UDP_GRO 104 /* GRO: receives may hold several datagrams; a cmsg gives their size */
#endif
#ifndef SO_RXQ_OVFL
#define SO_RXQ_OVFL 40 /* cmsg with the count of datagrams the receive queue dropped */
#endif

#endif /* DP_UDP_H */
