/* The native TLS ceiling of this machine: loopback throughput of plain TCP against TLS 1.3 (OpenSSL),
 * sender and receiver in two processes, memory -> socket -> discard (no protocol, no files).
 * It bounds what any TLS data path (a C extension, kernel TLS) could reach here; docs/benchmarks.md
 * ("replication") compares it with Python's ssl (raw_tls_MBps) and the HA figures.
 *
 *   openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout k.pem \
 *       -out c.pem -days 2 -subj /CN=x
 *   gcc -O2 -o tls_ceiling benchmarks/native/tls_ceiling.c -lssl -lcrypto
 *   ./tls_ceiling TLS MIB CHUNK_KIB c.pem k.pem [CIPHERSUITE]   # TLS 0: plain TCP, 1: TLS
 *
 * Prints one JSON line: {"tls":..,"MBps":..,"chunk_KiB":..,"MiB":..,"rc":<receiver's exit, 0 = all bytes>}.
 */
#include <openssl/ssl.h>
#include <openssl/err.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  int tls=atoi(argv[1]); long total=atol(argv[2])<<20; size_t chunk=atol(argv[3])<<10;
  const char*cert=argv[4],*key=argv[5],*cipher=argc>6?argv[6]:"TLS_AES_128_GCM_SHA256";
  int ls=socket(AF_INET,SOCK_STREAM,0); int one=1; setsockopt(ls,SOL_SOCKET,SO_REUSEADDR,&one,4);
  struct sockaddr_in a={0}; a.sin_family=AF_INET; a.sin_addr.s_addr=htonl(0x7f000001); a.sin_port=0;
  bind(ls,(void*)&a,sizeof a); listen(ls,1); socklen_t al=sizeof a; getsockname(ls,(void*)&a,&al);
  pid_t p=fork();
  if(p==0){ /* receiver */
    int s=accept(ls,0,0); char*buf=malloc(1<<20); long got=0; SSL*ssl=0;
    if(tls){SSL_CTX*c=SSL_CTX_new(TLS_server_method()); SSL_CTX_use_certificate_chain_file(c,cert);
      SSL_CTX_use_PrivateKey_file(c,key,SSL_FILETYPE_PEM); SSL_CTX_set_ciphersuites(c,cipher);
      ssl=SSL_new(c); SSL_set_fd(ssl,s); if(SSL_accept(ssl)<=0){ERR_print_errors_fp(stderr);exit(1);} }
    while(got<total){int n=tls?SSL_read(ssl,buf,1<<20):(int)read(s,buf,1<<20); if(n<=0)break; got+=n;}
    write(s,"k",1); exit(got==total?0:2);
  }
  int s=socket(AF_INET,SOCK_STREAM,0); connect(s,(void*)&a,sizeof a); SSL*ssl=0;
  if(tls){SSL_CTX*c=SSL_CTX_new(TLS_client_method()); SSL_CTX_set_ciphersuites(c,cipher);
    ssl=SSL_new(c); SSL_set_fd(ssl,s); if(SSL_connect(ssl)<=0){ERR_print_errors_fp(stderr);exit(1);} }
  char*buf=malloc(chunk); memset(buf,'x',chunk); long sent=0; double t0=now();
  while(sent<total){size_t n=chunk; if((long)n>total-sent)n=total-sent;
    int w=tls?SSL_write(ssl,buf,n):(int)write(s,buf,n); if(w<=0){perror("w");exit(1);} sent+=w;}
  char k; read(s,&k,1); double dt=now()-t0; int st; waitpid(p,&st,0);
  printf("{\"tls\":%d,\"MBps\":%.1f,\"chunk_KiB\":%ld,\"MiB\":%ld,\"rc\":%d}\n",tls,total/1e6/dt,(long)(chunk>>10),total>>20,WEXITSTATUS(st));
  return 0;}
